"""Metadata that contradicts the data it describes (a footer's row counts, a tar sample holding
a name twice, headers declaring sizes the file does not have): a ``FormatError`` naming the
dataset, the shard and where, never another row's data, a bare ``IndexError``, a hang or an
allocation per declared item."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.bombs import parquet_claiming_rows
from tests.formatdata import FIXTURES
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import FormatError

ROWS = 777


def _parquet(root: Path, claimed: int) -> Path:
    root.mkdir()
    good = pa.table({"id": list(range(ROWS)), "text": [f"row {i}" for i in range(ROWS)]})
    buf = io.BytesIO()
    pq.write_table(good, buf, row_group_size=1000)
    (root / "a.parquet").write_bytes(parquet_claiming_rows(buf.getvalue(), ROWS, claimed))
    pq.write_table(pa.table({"id": [1000, 1001], "text": ["b0", "b1"]}), root / "b.parquet")
    return root


def _pipe(ds: Dataset, **options: object) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="global", stop_after_passes=1)
    return Pipeline(ws, rank=0, world_size=1, **options)  # type: ignore[arg-type]


def test_a_footer_claiming_more_rows_than_its_row_group_holds(tmp_path: Path) -> None:
    ds = Dataset.from_path("claims", str(_parquet(tmp_path / "pq", ROWS + 23)), index_cache=False)
    assert ds.num_samples == ROWS + 23 + 2
    with pytest.raises(FormatError, match=f"holds {ROWS} rows, its footer says {ROWS + 23}") as e:
        list(_pipe(ds))
    assert "'claims'" in str(e.value) and "a.parquet" in str(e.value)
    # Skipping is what the user asked for: the row group's samples are skipped and counted.
    pipe = _pipe(ds, on_error="skip", max_skipped=10_000)
    got = list(pipe)
    assert {s["id"] for s in got} == {1000, 1001}
    skipped = pipe.stats()["skipped"]
    assert sum(s.get("samples", 1) for s in skipped) >= 1
    assert all("a.parquet" in s["shard"] for s in skipped)


@pytest.mark.timeout(30)
def test_a_footer_claiming_2_to_the_50_rows_is_refused_at_discovery(tmp_path: Path) -> None:
    root = _parquet(tmp_path / "pq", 2**50)
    with pytest.raises(FormatError, match="declares 1,125,899,906,842,624 rows") as caught:
        Dataset.from_path("claims", str(root), index_cache=False)
    assert "a.parquet" in str(caught.value)


def _tar(path: Path, members: list[tuple[str, bytes]], pax: dict[str, str] | None = None) -> None:
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            if pax:
                info.pax_headers = pax
            tar.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("name", ["0001.txt", "0001.__key__"])
def test_a_tar_sample_holding_a_name_twice_is_a_format_error(tmp_path: Path, name: str) -> None:
    root = tmp_path / "wds"
    root.mkdir()
    _tar(
        root / "a.tar",
        [("0000.txt", b"a"), ("0001.txt", b"first"), (name, b"second"), ("0002.txt", b"c")],
    )
    ds = Dataset.from_path("tars", str(root), index_cache=False)
    with pytest.raises(FormatError, match="twice") as caught:
        list(_pipe(ds))
    assert "a.tar" in str(caught.value) and "sample 1" in str(caught.value)


@pytest.mark.timeout(30)
def test_a_pax_record_of_length_zero_does_not_hang(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    root.mkdir()
    _tar(root / "a.tar", [("0000.txt", b"a")], pax={"comment": "x"})
    data = bytearray((root / "a.tar").read_bytes())
    record = data.find(b" comment=x\n")
    assert record > 0
    data[record - 2 : record] = b"00"  # "NN comment=x\n" -> "00 comment=x\n"
    (root / "a.tar").write_bytes(bytes(data))
    with pytest.raises(FormatError):
        list(_pipe(Dataset.from_path("tars", str(root), index_cache=False)))


def test_a_tar_extended_header_declaring_a_terabyte_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "wds"
    root.mkdir()
    header = tarfile.TarInfo("././@PaxHeader")
    header.type = tarfile.XHDTYPE
    header.size = 1 << 40
    block = header.tobuf(tarfile.GNU_FORMAT)
    (root / "a.tar").write_bytes(block + b"30 path=0000.txt\n" + bytes(8 << 20))
    with pytest.raises(FormatError, match="declares 1,099,511,627,776 bytes"):
        Dataset.from_path("tars", str(root), index_cache=False)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("fixture", "key", "field"),
    [
        ("mds", "shards", "samples"),
        ("mds-zstd", "shards", "samples"),
        ("litdata", "chunks", "chunk_size"),
        ("litdata-zstd", "chunks", "chunk_size"),
    ],
)
def test_an_index_declaring_2_to_the_40_samples_in_a_small_shard(
    tmp_path: Path, fixture: str, key: str, field: str
) -> None:
    """Planning is not per declared sample (the global shuffle over 2**40 takes no memory);
    the shard's own header then contradicts the index."""
    root = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, root)
    index = json.loads((root / "index.json").read_text())
    index[key][0][field] = 2**40
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match="expected 4398046511112") as caught:
        ds = Dataset.from_path("counts", str(root), index_cache=False)
        list(_pipe(ds))
    assert "'counts'" in str(caught.value) and index[key][0].get("filename", "") in str(
        caught.value
    )


def test_a_tar_member_declaring_a_terabyte_is_refused_at_discovery(tmp_path: Path) -> None:
    """Its data is skipped, never read or kept: the scan ends inside it, which is an error."""
    root = tmp_path / "wds"
    root.mkdir()
    member = tarfile.TarInfo("0000.jpg")
    member.size = 1 << 40
    (root / "a.tar").write_bytes(member.tobuf(tarfile.GNU_FORMAT) + bytes(1 << 20))
    with pytest.raises(FormatError, match="ends inside a member") as caught:
        Dataset.from_path("tars", str(root), index_cache=False)
    assert "a.tar" in str(caught.value)

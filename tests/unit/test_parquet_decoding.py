"""Parquet: footers read without pyarrow, row groups decoded with their own allocator (jemalloc
or the C library's, not Arrow's default), selected columns as pyarrow would give them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import FormatError
from zephon.formats import parquet as parquet_layout
from zephon.formats import parquet_arrow as parquet
from zephon.formats.thrift import read_struct


def _write(root: Path) -> list[dict[str, Any]]:
    root.mkdir()
    rows = [
        {"i": i, "text": f"row {i} " * 200, "meta": {"a": i, "b": [i, -i]}, "z": float(i)}
        for i in range(3000)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "p.parquet", row_group_size=1000)
    return rows


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    parquet.decode_pool.cache_clear()
    yield
    parquet.decode_pool.cache_clear()


def test_row_groups_are_decoded_outside_arrows_default_pool(
    tmp_path: Path, fresh_pool: Any
) -> None:
    rows = _write(tmp_path / "pq")
    pool = parquet.decode_pool()
    assert pool.backend_name in ("jemalloc", "system")
    default = pa.default_memory_pool()
    assert default.backend_name != pool.backend_name
    baseline = default.bytes_allocated()
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    for shuffle in ("block", "global"):  # rows picked in runs, and one by one (a copy)
        ws = StaticMixtureWorkSource([ds], shuffle=shuffle, seed=3, stop_after_passes=1)
        got = list(Pipeline(ws, lanes=1))
        assert sorted(s["i"] for s in got) == [r["i"] for r in rows]
        # The dataset's codec keeps the last row groups decoded (1,000 rows of 1.4 KB of
        # text each) in the decode pool; Arrow's default one holds none of them. (Pages are
        # decompressed through the default pool for a moment: Arrow's reader properties
        # take no pool from Python.)
        assert pool.bytes_allocated() > 1_000_000
        assert default.bytes_allocated() - baseline < 100_000


def test_selected_columns_come_in_the_order_asked_nested_ones_whole(
    tmp_path: Path, fresh_pool: Any
) -> None:
    _write(tmp_path / "pq")
    columns = ["z", "meta", "i"]
    expected = pq.read_table(tmp_path / "pq" / "p.parquet", columns=columns).to_pylist()
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), columns=columns, index_cache=False)
    ws = StaticMixtureWorkSource([ds], stop_after_passes=1)
    got = sorted(Pipeline(ws, lanes=1), key=lambda s: s["i"])
    assert got == expected
    assert all(list(s) == columns for s in got)
    assert got[7]["meta"] == {"a": 7, "b": [7, -7]}


def test_a_pool_named_in_the_environment_is_arrows_default(
    monkeypatch: pytest.MonkeyPatch, fresh_pool: Any
) -> None:
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    parquet.decode_pool.cache_clear()
    assert parquet.decode_pool().backend_name == pa.default_memory_pool().backend_name


def test_discovery_and_planning_leave_pyarrow_to_the_process_that_decodes(tmp_path: Path) -> None:
    """A trainer whose DataLoader workers decode never loads Arrow: finding a Parquet
    dataset, its columns and a pipeline over it read footers without it."""
    _write(tmp_path / "pq")
    script = f"""
import sys
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
ds = Dataset.from_path("pq", {str(tmp_path / "pq")!r}, columns=["i", "meta"], index_cache=False)
pipe = Pipeline(StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1), lanes=1)
assert "pyarrow" not in sys.modules, "discovery imported pyarrow"
rows = list(pipe)
assert len(rows) == 3000 and set(rows[0]) == {{"i", "meta"}}
assert "pyarrow" in sys.modules
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_a_column_whose_name_has_a_dot_is_one_column(tmp_path: Path) -> None:
    (tmp_path / "pq").mkdir()
    table = pa.table({"a.b": [1, 2, 3], "a": [4, 5, 6], "c": ["x", "y", "z"]})
    pq.write_table(table, tmp_path / "pq" / "p.parquet")
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), columns=["a.b", "c"], index_cache=False)
    got = list(Pipeline(StaticMixtureWorkSource([ds], shuffle="none", stop_after_passes=1)))
    assert got == [{"a.b": 1, "c": "x"}, {"a.b": 2, "c": "y"}, {"a.b": 3, "c": "z"}]


def test_a_footer_arrow_refuses_is_a_format_error_naming_the_shard_and_row(
    tmp_path: Path,
) -> None:
    """Discovery reads a footer's Thrift; metadata that parses as Thrift but not for Arrow
    (a damaged Arrow schema among its key-value pairs) is found when a row group is decoded."""
    (tmp_path / "pq").mkdir()
    table = pa.table({"i": list(range(40))})
    path = tmp_path / "pq" / "p.parquet"
    pq.write_table(table, path, row_group_size=10)
    data = bytearray(path.read_bytes())
    key = data.rfind(b"ARROW:schema")
    assert key > 0
    at = key + len(b"ARROW:schema") + 8  # past the field header and the length
    data[at : at + 12] = b"A" * 12  # the base64 of the schema's flatbuffer, damaged
    path.write_bytes(bytes(data))
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    pipe = Pipeline(StaticMixtureWorkSource([ds], shuffle="none", stop_after_passes=1))
    with pytest.raises(FormatError) as info:
        list(pipe)
    assert "p.parquet" in str(info.value) and info.value.dataset == "pq"
    assert info.value.sample == 0


@pytest.mark.parametrize(
    "table",
    [
        pa.table({"a": [1], "b": ["x"]}),
        pa.table({"s": [{"x": 1, "y": {"z": [1, 2]}}], "n": [None]}),
        pa.table({"l": [[1, 2]], "ll": [[[1], [2, 3]]], "ls": [[{"p": 1, "q": "r"}]]}),
        pa.table({"m": pa.array([[("k", 1)]], pa.map_(pa.string(), pa.int64())), "t": [1.5]}),
        pa.table({"d": pa.array(["x", "y"]).dictionary_encode(), "b": [b"1", b"2"]}),
    ],
)
def test_leaf_columns_from_the_footers_thrift_are_pyarrows(tmp_path: Path, table: pa.Table) -> None:
    path = tmp_path / "p.parquet"
    pq.write_table(table, path)
    data = path.read_bytes()
    need = parquet_layout.footer_length(data[-8:], len(data))
    fields = parquet_layout.leaf_fields(read_struct(data[len(data) - need : -8]))
    md = pq.ParquetFile(path).metadata
    assert fields == [md.schema.column(c).path.split(".")[0] for c in range(md.num_columns)]
    for name in table.column_names:  # each top-level column alone reads as pyarrow reads it
        ds = Dataset.from_path("pq", str(tmp_path), columns=[name], index_cache=False)
        got = list(Pipeline(StaticMixtureWorkSource([ds], shuffle="none", stop_after_passes=1)))
        assert got == pq.read_table(path, columns=[name]).to_pylist()

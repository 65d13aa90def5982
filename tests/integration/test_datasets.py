"""Every format, discovered and read by range from local disk, S3 and GCS, equals what the
format's own reader returns."""

from __future__ import annotations

import asyncio
import json
import random
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.formatdata import (
    FIXTURES,
    reference,
    to_jsonable,
    write_compressed_jsonl,
    write_jsonl,
    write_more_compressed_jsonl,
    write_parquet,
    write_webdataset,
)
from zephon.dataset import PERSISTENT_INDEX_NAME, Dataset, locate
from zephon.errors import ObjectChanged
from zephon.storage import open_storage
from zephon.testing import Azurite, GCSEmulator, S3Endpoint

pytestmark = pytest.mark.integration

Location = tuple[str, dict[str, Any], Callable[[Path], Awaitable[None]]]


async def read_all(ds: Dataset) -> list[Any]:
    async with ds.open_storage() as storage:
        parts = await asyncio.gather(
            *(ds.aread(storage, i, range(s.num_samples)) for i, s in enumerate(ds.shards))
        )
    return [sample for part in parts for sample in part]


async def _upload(base: str, options: dict[str, Any], src: Path) -> None:
    async with open_storage(base, options) as storage:
        await asyncio.gather(
            *(
                storage.write(base + p.relative_to(src).as_posix(), p.read_bytes())
                for p in sorted(src.rglob("*"))
                if p.is_file()
            )
        )


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """(base URI, storage options, upload(src dir)) for one storage location."""
    if request.param == "local":
        base = str(tmp_path / "data") + "/"

        async def copy(src: Path) -> None:
            shutil.copytree(src, base, dirs_exist_ok=True)

        return base, {}, copy
    if request.param == "s3":
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        base = f"s3://{request.getfixturevalue('s3_bucket')}/data/"
        options = endpoint.storage_options()
    elif request.param == "azure":
        azurite: Azurite = request.getfixturevalue("azurite")
        base = f"az://{request.getfixturevalue('azure_container')}/data/"
        options = azurite.storage_options()
    else:
        emulator: GCSEmulator = request.getfixturevalue("gcs_emulator")
        base = f"gs://{request.getfixturevalue('gcs_bucket')}/data/"
        options = {"endpoint_url": emulator.url}

    async def upload(src: Path) -> None:
        await _upload(base, options, src)

    return base, options, upload


async def test_jsonl(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_jsonl(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("web", base, storage_options=options)
    assert ds.format == "jsonl"
    assert [s.num_samples for s in ds.shards] == [57] * 5
    assert ds.num_samples == len(expected)
    assert await read_all(ds) == expected


async def test_compressed_jsonl(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_compressed_jsonl(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("z", base, storage_options=options)
    assert [s.num_samples for s in ds.shards] == [40, 33]
    assert await read_all(ds) == expected


async def test_bz2_xz_and_concatenated_streams(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_more_compressed_jsonl(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("z", base, storage_options=options)
    assert ds.format == "jsonl"
    assert [s.num_samples for s in ds.shards] == [31, 17, 25, 12, 9]
    assert await read_all(ds) == expected


async def test_parquet(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_parquet(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("tab", base, storage_options=options)
    assert ds.format == "parquet"
    assert [s.num_samples for s in ds.shards] == [250, 287, 324]
    assert ds.discovery_stats.requests <= 2 + len(ds.shards)  # a listing, one footer read each
    assert await read_all(ds) == expected


async def test_parquet_reads_only_selected_columns(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    src = tmp_path / "src"
    src.mkdir()
    rng = random.Random(3)
    expected = [{"id": i, "text": rng.randbytes(1500).hex()} for i in range(256)]
    pq.write_table(pa.Table.from_pylist(expected), src / "wide.parquet", row_group_size=64)
    await upload(src)
    full = await Dataset.afrom_path("all", base, storage_options=options)
    narrow = await Dataset.afrom_path("ids", base, storage_options=options, columns=["id"])
    async with narrow.open_storage() as storage:
        rows = await narrow.aread(storage, 0, [0, 1, 63, 64, 249, 5])
        narrow_bytes = storage.stats.bytes_read
    async with full.open_storage() as storage:
        await full.aread(storage, 0, [0, 1, 63, 64, 249, 5])
        full_bytes = storage.stats.bytes_read
    assert rows == [{"id": expected[i]["id"]} for i in [0, 1, 63, 64, 249, 5]]
    assert narrow_bytes * 20 < full_bytes  # the text column chunks were never fetched


async def test_webdataset(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_webdataset(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("wds", base, storage_options=options)
    assert ds.format == "webdataset"
    assert ds.num_samples == 60
    assert await read_all(ds) == expected


@pytest.mark.parametrize(
    "fixture",
    [
        "mds",
        "litdata",
        "mds-zstd",
        "mds-gz",
        "mds-bz2",
        "mds-br",
        "mds-snappy",
        "litdata-zstd",
        "litdata-zstd-chunk",
        "litdata-zstd-sample",
    ],
)
async def test_real_writer_fixtures(location: Location, fixture: str) -> None:
    base, options, upload = location
    await upload(FIXTURES / fixture)
    ds = await Dataset.afrom_path(fixture, base, storage_options=options)
    assert ds.format == fixture.split("-")[0]
    assert ds.discovery_stats.requests <= 3 + len(ds.shards)  # compressed: metadata only
    expected = reference(fixture)
    assert ds.num_samples == len(expected)
    assert to_jsonable(await read_all(ds)) == expected


async def test_vortex_fixture_through_every_storage_backend(location: Location) -> None:
    pytest.importorskip("vortex")
    base, options, upload = location
    await upload(FIXTURES / "vortex")
    ds = await Dataset.afrom_path("vortex", base, storage_options=options, format="vortex")
    assert ds.format == "vortex"
    assert await read_all(ds) == reference("vortex")


async def test_lance_fixture(location: Location, request: pytest.FixtureRequest) -> None:
    pytest.importorskip("lance")
    base, options, upload = location
    if not base.startswith(("s3://", "/")):
        pytest.skip("Lance's own object store is tested on local disk and S3")
    await upload(FIXTURES / "lance")
    ds = await Dataset.afrom_path("lance", base + "data.lance", storage_options=options)
    assert ds.format == "lance"
    assert await read_all(ds) == reference("lance")


async def test_random_access_by_range(location: Location, tmp_path: Path) -> None:
    base, options, upload = location
    expected = write_jsonl(tmp_path / "src")
    await upload(tmp_path / "src")
    ds = await Dataset.afrom_path("web", base, storage_options=options)
    picks = [56, 3, 30, 12, 0]
    async with ds.open_storage() as storage:
        got = await ds.aread(storage, 2, picks)
    assert got == [expected[2 * 57 + i] for i in picks]


async def test_persistent_index_replaces_the_scan(
    location: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, options, upload = location
    monkeypatch.setenv("WORLD_SIZE", "4")  # a rank of a job: no speculative requests
    write_jsonl(tmp_path / "src", shards=6)
    await upload(tmp_path / "src")
    first = await Dataset.afrom_path("web", base, storage_options=options, index_cache=False)
    assert first.discovery_stats.indexed == 6
    await first.awrite_index()
    again = await Dataset.afrom_path("web", base, storage_options=options, index_cache=False)
    st = again.discovery_stats
    assert (st.indexed, st.from_persistent_index) == (0, 6)
    assert st.listed == 0 and st.requests == 1  # no listing, no HEAD: one GET of the index
    assert again.shards == first.shards
    assert await read_all(again) == await read_all(first)
    assert all(PERSISTENT_INDEX_NAME not in s.uri for s in again.shards)
    # An index larger than the first read: the rest is read after a HEAD.
    monkeypatch.setattr(locate, "_FIRST_READ", 64)
    big = await Dataset.afrom_path("web", base, storage_options=options, index_cache=False)
    assert big.discovery_stats.requests == 3 and big.shards == first.shards
    monkeypatch.undo()
    # Reads stay pinned to the versions the index names: a rewritten shard is caught.
    (tmp_path / "src" / sorted(p.name for p in (tmp_path / "src").iterdir())[1]).write_text(
        '{"id": -1}\n' * 57
    )
    await upload(tmp_path / "src")
    pinned = await Dataset.afrom_path("web", base, storage_options=options, index_cache=False)
    assert pinned.discovery_stats.listed == 0
    with pytest.raises(ObjectChanged):
        await read_all(pinned)


async def test_a_prefix_seen_without_an_index_probes_and_lists_together(
    location: Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The local index cache notes a prefix that had no persistent index; a rank's next
    discovery sends the probe and the listing at once, and an index written since still
    wins (a process alone: tests/integration/test_discovery_round_trips.py)."""
    from zephon.dataset.cache import IndexCache

    base, options, upload = location
    monkeypatch.setenv("WORLD_SIZE", "4")
    write_jsonl(tmp_path / "src", shards=4)
    await upload(tmp_path / "src")
    where = tmp_path / "cache"
    first = await Dataset.afrom_path("web", base, storage_options=options, index_cache=where)
    root = first.root
    assert IndexCache(where).had_index(root) is False
    again = await Dataset.afrom_path("web", base, storage_options=options, index_cache=where)
    st = again.discovery_stats
    assert again.shards == first.shards and st.listed == 4 and st.indexed == 0
    assert st.requests == 1  # the probe (a listing is not a read)
    assert await read_all(again) == await read_all(first)
    await again.awrite_index()
    third = await Dataset.afrom_path("web", base, storage_options=options, index_cache=where)
    assert third.discovery_stats.from_persistent_index == 4
    assert third.discovery_stats.listed == 0 and third.shards == first.shards
    assert IndexCache(where).had_index(root) is True


async def test_gcs_scheme_spelling_finds_the_same_shards(
    gcs_emulator: GCSEmulator, gcs_bucket: str, tmp_path: Path
) -> None:
    expected = write_jsonl(tmp_path / "src")
    options = {"endpoint_url": gcs_emulator.url}
    await _upload(f"gs://{gcs_bucket}/data/", options, tmp_path / "src")
    spelled = await Dataset.afrom_path("g", f"gcs://{gcs_bucket}/data/", storage_options=options)
    plain = await Dataset.afrom_path("g", f"gs://{gcs_bucket}/data/", storage_options=options)
    assert [s.uri for s in spelled.shards] == [s.uri for s in plain.shards]
    assert await read_all(spelled) == expected


async def test_columns_project_on_the_first_discovery_and_name_what_is_missing(
    tmp_path: Path,
) -> None:
    from zephon.errors import ConfigError, FormatError

    rng = random.Random(4)
    rows = [{"id": i, "text": rng.randbytes(1500).hex()} for i in range(256)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "wide.parquet", row_group_size=64)
    narrow = await Dataset.afrom_path("ids", str(tmp_path), columns=["id"], index_cache=False)
    async with narrow.open_storage() as storage:  # a fresh index, never cached: still narrow
        got = await narrow.aread(storage, 0, [0, 1, 200])
        assert storage.stats.bytes_read * 20 < (tmp_path / "wide.parquet").stat().st_size
    assert got == [{"id": 0}, {"id": 1}, {"id": 200}]
    with pytest.raises(ConfigError, match=r"\['nope'\] not in the file.*wide.parquet"):
        await Dataset.afrom_path("bad", str(tmp_path), columns=["id", "nope"], index_cache=False)
    lines = tmp_path / "j"
    lines.mkdir()
    (lines / "a.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:10]))
    ds = await Dataset.afrom_path("j", str(lines), columns=["id"])
    assert await ds.ahead(3) == [{"id": 0}, {"id": 1}, {"id": 2}]  # JSONL projects too
    missing = await Dataset.afrom_path("j", str(lines), columns=["id", "nope"])
    with pytest.raises(FormatError, match=r"sample 0.*lacks columns \['nope'\]|lacks columns"):
        await missing.ahead(1)

"""The default chunk size: about 16 MiB of samples (1024 for text), and whole Parquet row groups,
so no row group is read by two lanes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.formatdata import write_jsonl
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.formats.index import RecordIndex
from zephon.plan.manifest import Manifest, _Records


def write_groups(root: Path, shards: int, rows: int, group: int) -> int:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows)
        text = [rng.bytes(300).hex() for _ in ids]  # incompressible: bytes follow rows
        pq.write_table(
            pa.table({"id": ids, "text": text}), root / f"p{s}.parquet", row_group_size=group
        )
    return sum(p.stat().st_size for p in root.iterdir())


@pytest.mark.parametrize("shuffle", ["block", "shards", "none"])
def test_lanes_that_share_no_cache_read_each_row_group_once(tmp_path: Path, shuffle: str) -> None:
    # 10,800 rows: whole rounds of 3 lanes x 900. (The remainder of a pass that is not, less
    # than a round, is dealt in pieces that may share row groups: a bounded overhead.)
    size = write_groups(tmp_path / "pq", shards=6, rows=1800, group=300)
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=2, shuffle=shuffle)
    assert ws.chunk_size == 900  # three row groups
    # No range cache: the lanes fetch as if in separate processes (DataLoader workers).
    pipe = Pipeline(ws, lanes=3, range_cache_bytes=0)
    ids = sorted(int(s["id"]) for s in pipe)
    assert ids == list(range(10_800))
    assert pipe.stats()["fetch"]["bytes"] <= 1.05 * size
    # The old default, 1024 pointers, cuts row groups between lanes: many are read twice.
    cut = StaticMixtureWorkSource([ds], seed=2, shuffle=shuffle, chunk_size=1024)
    old = Pipeline(cut, lanes=3, range_cache_bytes=0)
    assert sum(1 for _ in old) == 10_800
    assert old.stats()["fetch"]["bytes"] > 1.2 * size


def test_the_default_is_1024_unless_every_dataset_has_one_row_group_size(tmp_path: Path) -> None:
    write_groups(tmp_path / "a", shards=3, rows=1000, group=128)
    write_groups(tmp_path / "b", shards=3, rows=1000, group=200)
    write_groups(tmp_path / "big", shards=2, rows=20_000, group=10_000)
    write_jsonl(tmp_path / "j", shards=2, per_shard=50)
    a, b, big, j = (
        Dataset.from_path(n, str(tmp_path / n), index_cache=False) for n in ("a", "b", "big", "j")
    )
    assert StaticMixtureWorkSource([a]).chunk_size == 1024  # 8 groups of 128
    assert StaticMixtureWorkSource([b]).chunk_size == 1000
    assert StaticMixtureWorkSource([a, b]).chunk_size == 1024  # two row group sizes
    assert StaticMixtureWorkSource([b, j]).chunk_size == 1024  # not all Parquet
    assert StaticMixtureWorkSource([big]).chunk_size == 1024  # groups too large to deal
    assert StaticMixtureWorkSource([j]).chunk_size == 1024
    assert StaticMixtureWorkSource([b], chunk_size=64).chunk_size == 64


def records(name: str, shards: int, per_shard: int, nbytes: int) -> Manifest:
    """A record dataset of ``shards`` x ``per_shard`` samples of ``nbytes`` each."""
    offsets = np.arange(per_shard + 1, dtype=np.int64) * nbytes
    layouts = [_Records(RecordIndex(offsets)) for _ in range(shards)]
    return Manifest(
        name,
        f"{name}-{nbytes}",
        np.full(shards, per_shard, dtype=np.int64),
        [f"memory://t/{name}/{i}" for i in range(shards)],
        ["1"] * shards,
        layouts,
    )


def test_a_chunk_of_large_records_weighs_about_16_mib() -> None:
    # A block-shuffled chunk interleaves its runs: the first batch waits for the whole chunk.
    images = records("images", 8, 1000, 70_000)
    ws = StaticMixtureWorkSource([images])
    assert ws.chunk_size == 256  # 17.9 MB, not 1,024 x 70 KB = 72 MB
    assert ws.run_sizes == [64]  # about 4 MiB per read: the divisor nearest, not the one below
    assert StaticMixtureWorkSource([records("big", 4, 500, 1 << 20)]).chunk_size == 256  # floor
    assert StaticMixtureWorkSource([records("docs", 4, 5000, 1600)]).chunk_size == 1024
    # A mixture weighs its datasets by their share of the stream.
    docs = records("docs", 8, 20_000, 1600)
    assert StaticMixtureWorkSource([images, docs]).chunk_size == 1024  # 95% small documents
    even = StaticMixtureWorkSource([images, docs], mixture={"images": 1, "docs": 1})
    assert even.chunk_size == 512  # 36 KB a sample on average
    assert StaticMixtureWorkSource([images], chunk_size=1024).chunk_size == 1024


def test_large_parquet_rows_keep_whole_row_groups(tmp_path: Path) -> None:
    root = tmp_path / "pq"
    root.mkdir()
    rng = np.random.default_rng(0)
    for s in range(2):
        blobs = [rng.bytes(60_000) for _ in range(400)]  # incompressible images, say
        pq.write_table(
            pa.table({"id": np.arange(400), "jpg": blobs}),
            root / f"p{s}.parquet",
            row_group_size=100,
        )
    ws = StaticMixtureWorkSource([Dataset.from_path("pq", str(root), index_cache=False)])
    assert ws.chunk_size == 300  # groups of 100 rows, nearest 256 rows of ~60 KB

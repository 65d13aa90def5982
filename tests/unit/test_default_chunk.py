"""The default chunk size follows Parquet row groups, so no row group is read by two lanes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.formatdata import write_jsonl
from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def write_groups(root: Path, shards: int, rows: int, group: int) -> int:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for s in range(shards):
        ids = np.arange(s * rows, (s + 1) * rows)
        text = [rng.bytes(300).hex() for _ in ids]  # incompressible: bytes follow rows
        pq.write_table(pa.table({"id": ids, "text": text}), root / f"p{s}.parquet",
                       row_group_size=group)  # fmt: skip
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
    a, b, big, j = (Dataset.from_path(n, str(tmp_path / n), index_cache=False)
                    for n in ("a", "b", "big", "j"))  # fmt: skip
    assert StaticMixtureWorkSource([a]).chunk_size == 1024  # 8 groups of 128
    assert StaticMixtureWorkSource([b]).chunk_size == 1000
    assert StaticMixtureWorkSource([a, b]).chunk_size == 1024  # two row group sizes
    assert StaticMixtureWorkSource([b, j]).chunk_size == 1024  # not all Parquet
    assert StaticMixtureWorkSource([big]).chunk_size == 1024  # groups too large to deal
    assert StaticMixtureWorkSource([j]).chunk_size == 1024
    assert StaticMixtureWorkSource([b], chunk_size=64).chunk_size == 64

"""The cost-based read rule of a global shuffle: over small records, the plan's reads fetch at
most 1.3x the samples' bytes in at most twice the requests of the minimal plan (each read a
run of neighbouring samples), whatever the record size; with a range cache that holds the
data, gaps are read through as before (later chunks find their samples in it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon import Dataset, StaticMixtureWorkSource


def _reads(ws: StaticMixtureWorkSource, cache: int, chunks: int = 6) -> tuple[int, int, int]:
    """(requests, bytes read, bytes of the samples) of the first chunks of lane 0."""
    requests = fetched = data = 0
    for j, chunk in enumerate(ws.chunks(0, 1, cache_bytes=cache)):
        if j == chunks:
            break
        manifest = ws.manifests[0]
        data += int(manifest.sample_nbytes(chunk.shards, chunk.samples).sum())
        for r in chunk.requests:
            requests += len(r.ranges)
            fetched += sum(b - a for a, b in r.ranges)
    return requests, fetched, data


@pytest.mark.parametrize("size", [200, 1600, 6000])
def test_a_global_shuffle_reads_little_more_than_its_samples(tmp_path: Path, size: int) -> None:
    for s in range(4):
        rows = "".join(
            json.dumps({"i": s * 3000 + i, "t": "x" * (size + i % 97)}) + "\n" for i in range(3000)
        )
        (tmp_path / f"p{s}.jsonl").write_text(rows)
    ds = Dataset.from_path("w", str(tmp_path), index_cache=False)
    total = sum(s.size_bytes for s in ds.shards)

    def source(**kw: int) -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource([ds], seed=3, shuffle="global", chunk_size=2048, **kw)

    least, exact, data = _reads(source(coalesce_gap_bytes=0), 0)
    assert exact == data  # the minimal plan reads the samples and nothing else
    for cache in (0, total // 8):  # no cache, or one holding an eighth of the data
        requests, fetched, same = _reads(source(), cache)
        assert same == data and fetched <= 1.3 * data and requests <= 2 * least
    requests, fetched, _ = _reads(source(), 4 * total)  # the cache holds it all: read through
    assert requests < least / 2 and fetched > 1.3 * data


def test_the_range_cache_holds_the_large_units_a_shuffle_interleaves(tmp_path: Path) -> None:
    """Parquet row groups are read whole by every chunk that draws from them: the range
    cache holds four of the largest files' (a shuffle block's; up to 512 MiB), never less
    than asked for, and stays off when turned off."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from zephon import Pipeline

    rng = np.random.default_rng(0)
    for f in range(2):
        blobs = [rng.bytes(40_000) for _ in range(600)]  # incompressible: 2 groups of ~12 MB
        pq.write_table(pa.table({"b": blobs}), tmp_path / f"p{f}.parquet", row_group_size=300)
    (tmp_path / "text").mkdir()
    (tmp_path / "text" / "a.jsonl").write_text('{"t": "x"}\n' * 10)
    groups = Dataset.from_path("g", str(tmp_path), format="parquet", index_cache=False)
    text = Dataset.from_path("t", str(tmp_path / "text"), index_cache=False)

    def capacity(ds: Dataset, **kw: int) -> int:
        return Pipeline(StaticMixtureWorkSource([ds]), **kw).spec.range_cache_capacity

    chunks = groups.indexes[0].chunks
    expected = 4 * int((chunks[..., 1] - chunks[..., 0]).sum())
    assert 90 << 20 < expected == capacity(groups) < 512 << 20
    assert capacity(groups, range_cache_bytes=1 << 30) == 1 << 30
    assert capacity(groups, range_cache_bytes=0) == 0
    assert capacity(text) == 64 << 20

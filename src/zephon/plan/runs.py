"""Sizes the planner derives from a manifest: block-shuffle run sizes and mean sample bytes."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from zephon.formats.index import RowGroupIndex
from zephon.plan.manifest import Manifest

__all__ = [
    "DEFAULT_CHUNK",
    "default_chunk",
    "default_run",
    "mean_sample_bytes",
    "probe_sample_bytes",
]

_RUN_TARGET_BYTES = 4 << 20
_CHUNK_TARGET_BYTES = 16 << 20
DEFAULT_CHUNK = 1024
_MIN_CHUNK = 256  # smaller chunks of large records held more in memory (test_memory.py)
_MAX_GROUP_CHUNK = 8192  # rows: a chunk of one larger row group deals the lanes too coarsely


def default_chunk(
    manifests: list[Manifest], mixture_unit: str = "samples", weights: Sequence[float] = ()
) -> int:
    """Pointers per chunk when the user gives none.

    A chunk is what a lane's first batch waits for (a block-shuffled chunk interleaves its
    runs, so its first items need a read of each) and what the lanes are dealt: about
    ``_CHUNK_TARGET_BYTES`` of samples, as the power of two nearest that over the mixture's
    mean sample (``weights``, relative; default equal), within 256-1024 pointers. So 1024 for
    text, 256 for ~70 KB images (a 1,024-image chunk is 72 MB fetched before the first
    item). When every dataset is Parquet whose whole row groups (each shard's last aside)
    share one row count ``G`` of at most 8192, the multiple of ``G`` nearest that: chunks
    then begin and end on row groups, so a row group is not read by two lanes (lanes in
    different processes, torch ``DataLoader`` workers, share no cache and each would fetch
    the whole group). Token mixtures plan chunks of their own: 1024."""
    if mixture_unit != "samples":
        return DEFAULT_CHUNK
    target = _bytes_chunk(manifests, weights)
    group = _common_row_group(manifests)
    if not 0 < group <= _MAX_GROUP_CHUNK:
        return target
    return group * max(1, round(target / group))


def _bytes_chunk(manifests: list[Manifest], weights: Sequence[float]) -> int:
    shares = np.asarray(
        weights if len(weights) == len(manifests) else [1.0] * len(manifests), dtype=np.float64
    )
    sample = float(np.dot(shares / shares.sum(), [_head_sample_bytes(m) for m in manifests]))
    want = math.log2(max(1.0, _CHUNK_TARGET_BYTES / max(1.0, sample)))
    return int(min(DEFAULT_CHUNK, max(_MIN_CHUNK, 2 ** round(want))))


def _head_sample_bytes(manifest: Manifest) -> float:
    """Mean byte length of the first samples (up to 256) of the first shards (up to 16)."""
    counts = np.minimum(manifest.shard_samples[:16], 256)
    if counts.sum() == 0:
        return 1024.0
    shards = np.repeat(np.arange(len(counts)), counts)
    samples = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts, counts)
    return float(manifest.sample_nbytes(shards, manifest.kept(shards, samples)).mean())


def _common_row_group(manifests: list[Manifest]) -> int:
    """The one row count of every dataset's whole row groups, or 0."""
    common: set[int] = set()
    for manifest in manifests:
        layouts = manifest.layouts[:64]
        if not layouts or not all(isinstance(x, RowGroupIndex) for x in layouts):
            return 0
        rows = [np.diff(x.row_starts)[:-1] for x in layouts if isinstance(x, RowGroupIndex)]
        sizes = np.unique(np.concatenate(rows)) if rows else np.zeros(0, np.int64)
        if len(sizes) != 1:
            return 0
        common.add(int(sizes[0]))
    return common.pop() if len(common) == 1 else 0


def default_run(manifest: Manifest, chunk_size: int, block_size: int) -> int:
    """Samples kept together by block shuffling: for Parquet a row group (its read unit); for
    record formats enough samples for reads of about 4 MiB (every read costs a request), but
    at least a sixteenth of a chunk and at most a quarter of a block (or of the dataset). The
    result divides ``chunk_size`` or is a multiple of it, as :class:`DatasetOrder` needs."""
    rows = [
        int(np.median(np.diff(x.row_starts)))
        for x in manifest.layouts[:64]
        if isinstance(x, RowGroupIndex) and len(x.row_starts) > 1
    ]
    if rows:  # whole row groups, as many as make about 4 MiB
        group_rows = int(np.median(rows))
        group_bytes = _mean_group_bytes(manifest)
        want = group_rows * max(1, math.floor(_RUN_TARGET_BYTES / max(1.0, group_bytes)))
    else:
        sample_bytes = mean_sample_bytes(manifest)
        want = max(chunk_size // 16, math.ceil(_RUN_TARGET_BYTES / max(1.0, sample_bytes)))
    # A block (or a dataset smaller than one) holds at least four runs to move around.
    cap = max(1, min(block_size, manifest.num_samples) // 4)
    want = max(1, min(want, cap))
    if want >= chunk_size:
        return chunk_size * (want // chunk_size)
    # The divisor of the chunk nearest ``want`` by ratio, within the cap (a chunk of 256
    # images of 70 KB: runs of 64, reads of 4.4 MB, rather than 32 and twice the requests).
    divisors = [d for d in range(1, min(chunk_size, cap) + 1) if chunk_size % d == 0]
    return min(divisors, key=lambda d: (abs(math.log(d / want)), -d))


def _mean_group_bytes(manifest: Manifest) -> float:
    sizes = [
        float(x.group_nbytes.mean())
        for x in manifest.layouts[:64]
        if isinstance(x, RowGroupIndex) and len(x.group_nbytes)
    ]
    return float(np.mean(sizes)) if sizes else float(_RUN_TARGET_BYTES)


def mean_sample_bytes(manifest: Manifest) -> float:
    probe = min(manifest.num_shards, 16)
    counts = manifest.shard_samples[:probe]
    if not manifest.all_records or counts.sum() == 0:
        return 1024.0
    shards = np.flatnonzero(counts > 0).astype(np.int64)  # a selection may keep none of one
    counts = counts[shards]
    starts, _ = manifest.spans(shards, manifest.kept(shards, np.zeros(len(shards), np.int64)))
    _, stops = manifest.spans(shards, manifest.kept(shards, counts - 1))
    return float((stops - starts).sum()) / float(counts.sum())


def probe_sample_bytes(manifest: Manifest, probes: int = 4096) -> float:
    """Mean byte length of up to ``probes`` samples evenly spaced in storage order (any
    layout): what a token mixture expects a sample of this dataset to weigh."""
    n = manifest.num_samples
    ranks = np.unique(np.linspace(0, n - 1, min(n, probes)).astype(np.int64))
    cum = np.concatenate(([0], np.cumsum(manifest.shard_samples)))
    shards = np.searchsorted(cum, ranks, side="right") - 1
    return float(manifest.sample_nbytes(shards, manifest.kept(shards, ranks - cum[shards])).mean())

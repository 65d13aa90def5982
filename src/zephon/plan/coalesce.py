"""From a chunk's sample pointers to range requests.

Pointers of one shard are sorted by byte offset and merged into one read while the gap to the
next sample is at most ``gap_bytes`` and the read stays within about ``max_bytes``. Record
layouts are handled for the whole chunk at once in numpy; Parquet row groups (a read unit of
several column-chunk ranges) and whole-shard streams are grouped per unit. Each read lists
its samples in curriculum order with their slots in the chunk, and reads come in the order of
their first slot, so a consumer can rebuild the chunk's exact order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from zephon.arrays import distinct, in_order
from zephon.formats.index import FragmentIndex, RowGroupIndex, StreamIndex, WholeIndex
from zephon.plan.manifest import Manifest
from zephon.refs import Cursor, RangeRequest

__all__ = ["PlannedReads", "ReadGroups", "coalesce_chunks", "cut_requests", "group_reads"]


@dataclass(frozen=True, slots=True, eq=False)
class PlannedReads:
    """A chunk's reads in columns (one row per read, in the order of their first slot); the
    samples and slots of read ``i`` are ``samples[lo[i]:hi[i]]`` and ``slots[lo[i]:hi[i]]``.

    Planning stays columnar; :meth:`materialize` makes :class:`RangeRequest` objects for
    consumers that want them, at about a microsecond each (their samples and slots are views
    of these columns).
    """

    dataset: np.ndarray
    shard: np.ndarray
    unit: np.ndarray  # >= 0: a unit read (row group index, or 0 for a whole shard)
    start: np.ndarray
    stop: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    samples: np.ndarray
    slots: np.ndarray

    def __len__(self) -> int:
        return len(self.dataset)

    def materialize(
        self, manifests: Sequence[Manifest], cursor: Cursor, n: int, passes: np.ndarray
    ) -> list[RangeRequest]:
        """The reads as requests; ``passes``: the pass of each of the chunk's pointers."""
        d_o, sh_o, u_o = self.dataset.tolist(), self.shard.tolist(), self.unit.tolist()
        lo, hi = self.lo.tolist(), self.hi.tolist()
        samples, slots = self.samples, self.slots
        in_passes = passes[slots]
        uris = [m.uris for m in manifests]
        versions = [m.versions for m in manifests]
        ranges: list[tuple[tuple[int, int], ...]] = [
            ((a, b),) for a, b in zip(self.start.tolist(), self.stop.tolist(), strict=True)
        ]
        for i in np.flatnonzero(self.unit >= 0).tolist():  # unit reads: row groups, streams
            layout = manifests[d_o[i]].layouts[sh_o[i]]
            if isinstance(layout, RowGroupIndex):
                ranges[i] = _merge([(int(x), int(y)) for x, y in layout.chunks[u_o[i]]])
            else:  # a whole shard, or nothing (a format that reads its own rows)
                ranges[i] = tuple(layout.span(0, 0))
        new = tuple.__new__  # the named tuple's own __new__ is a Python function: skip it
        return [
            new(
                RangeRequest,
                (
                    d,
                    sh,
                    uris[d][sh],
                    versions[d][sh],
                    rg,
                    samples[a:b],
                    slots[a:b],
                    cursor,
                    n,
                    in_passes[a:b],
                ),
            )
            for d, sh, rg, a, b in zip(d_o, sh_o, ranges, lo, hi, strict=True)
        ]


def coalesce_chunks(
    manifests: Sequence[Manifest],
    datasets: np.ndarray,
    shards: np.ndarray,
    samples: np.ndarray,
    gap_bytes: int,
    max_bytes: int,
    chunk_size: int,
    window_bytes: int | None = None,
    reuse: float | None = None,
) -> list[PlannedReads]:
    """The reads of consecutive chunks at once: pointers ``[j * chunk_size, (j + 1) *
    chunk_size)`` form chunk ``j`` (the last may be shorter). No read spans two chunks, so
    each chunk's reads are exactly those of planning it alone, for a fraction of the numpy
    calls per chunk. Long because it is one sequence of array passes over the same columns
    (sort, cut, group); split, it would pass a dozen arrays between helpers.

    ``window_bytes`` (default ``max_bytes``): large records are read within windows of the
    chunk of about this many bytes (what whoever puts them back in order holds).

    ``reuse`` (a global shuffle's; ``None`` otherwise): the chance that bytes fetched between
    two samples are still in the range cache when a later chunk draws them. A gap is then read
    only where it pays (see :func:`_worth_reading`), not merely where it is under
    ``gap_bytes``."""
    n = len(datasets)
    slots = np.arange(n, dtype=np.int64)
    chunk = slots // chunk_size
    starts = np.zeros(n, np.int64)
    stops = np.zeros(n, np.int64)
    units = np.full(n, -1, np.int64)  # >= 0 marks a unit read (row group or whole shard)
    for d in distinct(datasets):
        mask = datasets == d
        manifest = manifests[int(d)]
        if manifest.all_records:
            starts[mask], stops[mask] = manifest.spans(shards[mask], samples[mask])
            continue
        if manifest.all_row_groups:
            units[mask] = manifest.row_groups(shards[mask], samples[mask])
            continue
        where = np.flatnonzero(mask)
        for shard in distinct(shards[where]):
            at = where[shards[where] == shard]
            layout = manifest.layouts[shard]
            if isinstance(layout, RowGroupIndex):
                units[at] = np.searchsorted(layout.row_starts, samples[at], side="right") - 1
            elif isinstance(layout, StreamIndex | WholeIndex | FragmentIndex):
                units[at] = 0
            else:
                starts[at], stops[at] = layout.starts(samples[at]), layout.stops(samples[at])

    windows = _slot_windows(
        datasets, units, starts, stops, slots % chunk_size, window_bytes or max_bytes, chunk_size
    )
    keys = (datasets, shards, units, windows, starts)
    ordered = in_order(keys, within=chunk)  # storage order already (no shuffle, say)
    if ordered:
        c_s, d_s, sh_s, u_s, st_s, sp_s = chunk, datasets, shards, units, starts, stops
        w_s = windows
    else:
        order = _storage_order(chunk, datasets, shards, units, windows, starts)
        c_s, d_s, sh_s, u_s = chunk[order], datasets[order], shards[order], units[order]
        st_s, sp_s, w_s = starts[order], stops[order], windows[order]
    new = np.ones(n, dtype=bool)
    same_shard = (
        (c_s[1:] == c_s[:-1])
        & (d_s[1:] == d_s[:-1])
        & (sh_s[1:] == sh_s[:-1])
        & (u_s[1:] == u_s[:-1])
        & (w_s[1:] == w_s[:-1])
    )
    if bool((u_s >= 0).all()):  # unit reads only (Parquet): one read per unit, no byte gaps
        new[1:] = ~same_shard
    else:
        new = _split_reads(new, same_shard, u_s, st_s, sp_s, gap_bytes, max_bytes, reuse)
    seg = np.cumsum(new) - 1
    heads_sorted = np.flatnonzero(new)

    # Within each segment, curriculum (slot) order; segments by their first slot (so by chunk,
    # as segment ids are).
    if ordered:  # segments are runs of consecutive slots already
        seg_b, final_slots, final_samples = seg, slots, samples
        bounds = np.append(heads_sorted, n)
    else:
        slot_s = slots[order]
        by_slot = np.argsort(seg * n + slot_s)  # (segment, slot): unique, one key
        seg_b = seg[by_slot]
        final_slots = slot_s[by_slot]
        final_samples = samples[order][by_slot]
        is_head = np.ones(n, dtype=bool)
        is_head[1:] = seg_b[1:] != seg_b[:-1]
        bounds = np.append(np.flatnonzero(is_head), n)
    heads = bounds[:-1]
    seg_ids = seg_b[heads]
    seg_start = np.minimum.reduceat(st_s, heads_sorted) if n else st_s
    seg_stop = np.maximum.reduceat(sp_s, heads_sorted) if n else sp_s

    emit = np.argsort(final_slots[heads], kind="stable")
    sid = seg_ids[emit]
    head = heads_sorted[sid]
    r_dataset, r_shard, r_unit = d_s[head], sh_s[head], u_s[head]
    r_start, r_stop = seg_start[sid], seg_stop[sid]
    r_lo, r_hi = bounds[:-1][emit], bounds[1:][emit]
    # Reads are in slot order, so each chunk's are a contiguous run of them, and its
    # pointers the chunk's own stretch of the arrays.
    chunks = -(-n // chunk_size)
    cuts = np.searchsorted(r_lo, np.arange(chunks + 1) * chunk_size).tolist()
    out = []
    for j in range(chunks):
        a, b = cuts[j], cuts[j + 1]
        base = j * chunk_size
        end = min(n, base + chunk_size)
        out.append(
            PlannedReads(
                dataset=r_dataset[a:b],
                shard=r_shard[a:b],
                unit=r_unit[a:b],
                start=r_start[a:b],
                stop=r_stop[a:b],
                lo=r_lo[a:b] - base,
                hi=r_hi[a:b] - base,
                samples=final_samples[base:end],
                slots=final_slots[base:end] - base,
            )
        )
    return out


def _storage_order(
    chunk: np.ndarray,
    datasets: np.ndarray,
    shards: np.ndarray,
    units: np.ndarray,
    windows: np.ndarray,
    starts: np.ndarray,
) -> np.ndarray:
    """The stable order by (chunk, dataset, shard, unit, window, start). Each key costs a
    sort pass, so chunk, dataset and shard are packed into one integer when they fit and
    keys that do not vary (units and windows, mostly) are left out."""
    keys = [starts]
    keys += [k for k in (windows, units) if len(k) and k.min() != k.max()]
    if len(chunk) and chunk.max() < 1 << 15 and datasets.max() < 1 << 15 and shards.max() < 1 << 32:
        i64 = np.int64
        keys.append((chunk.astype(i64) << 47) | (datasets.astype(i64) << 32) | shards.astype(i64))
    else:
        keys += [shards, datasets, chunk]
    return np.lexsort(tuple(keys)) if len(keys) > 1 else np.argsort(keys[0], kind="stable")


def _slot_windows(
    datasets: np.ndarray,
    units: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    positions: np.ndarray,
    max_bytes: int,
    chunk_size: int,
) -> np.ndarray:
    """Per pointer, the window of its chunk it may be read with: record samples of a
    dataset whose chunk weighs more than ``max_bytes`` are only coalesced within windows of
    about ``max_bytes`` of consecutive positions (``positions``: slots within the chunk).

    A read then never spans more than a window of the curriculum, so whoever puts a chunk's
    samples back in order holds about a window of them, not the chunk (large records). With
    small records the chunk fits one window and reads are as before."""
    windows = np.zeros(len(datasets), np.int64)
    if not len(datasets) or int((stops - starts).max()) * chunk_size <= max_bytes:
        return windows  # no sample is large enough for its dataset's chunk to need windows
    # The mean record size of each (chunk, dataset): a chunk's windows depend on the chunk
    # alone, never on the chunks planned with it.
    records = units < 0
    chunk = np.arange(len(datasets), dtype=np.int64) // chunk_size
    group = chunk * (int(datasets.max()) + 1) + datasets
    sizes = np.bincount(group[records], weights=(stops - starts)[records])
    counts = np.bincount(group[records])
    mean = sizes[group[records]] / counts[group[records]]
    per_window = np.maximum(1, (max_bytes // np.maximum(mean, 1.0)).astype(np.int64))
    windows[records] = np.where(mean * chunk_size > max_bytes, positions[records] // per_window, 0)
    return windows


def _split_reads(
    new: np.ndarray,
    same_shard: np.ndarray,
    units: np.ndarray,
    starts: np.ndarray,
    stops: np.ndarray,
    gap_bytes: int,
    max_bytes: int,
    reuse: float | None = None,
) -> np.ndarray:
    """Where reads begin among sorted pointers that include record reads: a new shard or
    unit, a gap over ``gap_bytes`` (or, with ``reuse``, one not worth reading), or
    ``max_bytes`` past the read's start."""
    if len(new) > 1:
        # Furthest byte reached so far *within the shard*: a running maximum restarted at each
        # shard by lifting every shard onto its own range of values.
        shard_id = np.concatenate(([0], np.cumsum(~same_shard)))
        lift = shard_id.astype(np.int64) << 42
        running_stop = np.maximum.accumulate(np.where(units < 0, stops, 0) + lift) - lift
        gaps = starts[1:] - running_stop[:-1]
        close = gaps <= gap_bytes
        if reuse is not None:
            sizes = stops - starts
            close &= _worth_reading(gaps, sizes[:-1], sizes[1:], reuse)
        new[1:] = ~(same_shard & ((units[1:] >= 0) | close))
    group = np.cumsum(new) - 1
    # Split groups that grew past max_bytes: a new read every max_bytes from the group start.
    first_start = starts[new][group]
    piece = np.maximum(np.where(units < 0, (stops - first_start - 1) // max_bytes, 0), 0)
    out = new.copy()
    if len(new) > 1:
        out[1:] |= (group[1:] == group[:-1]) & (piece[1:] != piece[:-1])
    return out


READ_BUDGET = 0.3  # a global shuffle's reads fetch at most this much more than they carry
FREE_GAP = 512  # bytes: less than a request's own headers, always read through


def _worth_reading(
    gaps: np.ndarray, before: np.ndarray, after: np.ndarray, reuse: float
) -> np.ndarray:
    """Whether each gap between two samples is read through (one request instead of two):
    the bytes that fetching it wastes, those the range cache will not serve to a later chunk
    (a share ``1 - reuse`` of them), may be at most :data:`READ_BUDGET` of the two samples'
    bytes (half of each: a sample borders two gaps). A round trip saved is worth at most
    ``gap_bytes``, already checked; this keeps the bytes fetched within about 1.3x of the
    data however small the records, where a flat 64 KiB gap fetched 2.5x of a global
    shuffle of 1.6 KB records (and 10x with a small cache). Gaps under :data:`FREE_GAP`
    always are."""
    wasted = gaps * (1.0 - min(max(reuse, 0.0), 1.0))
    return np.asarray((gaps <= FREE_GAP) | (wasted <= READ_BUDGET * (before + after) / 2))


def _merge(ranges: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(ranges):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return tuple(merged)


def cut_requests(requests: Sequence[RangeRequest], skip: int, stop: int) -> list[RangeRequest]:
    """A chunk's reads of slots ``[skip, stop)`` only, still in the order of their first
    slot (cutting a read's head may move it behind another's)."""
    out = []
    for request in requests:
        if request.slots[0] < skip or request.slots[-1] >= stop:
            kept = (request.slots >= skip) & (request.slots < stop)
            if not kept.any():
                continue
            passes = None if request.passes is None else request.passes[kept]
            request = request._replace(
                samples=request.samples[kept], slots=request.slots[kept], passes=passes
            )
        out.append(request)
    return sorted(out, key=lambda r: int(r.slots[0])) if skip else out


class ReadGroups:
    """Runs of consecutive single-range requests that read neighbouring bytes of one shard,
    each fetched by one storage read (:func:`zephon.ops.fetch.group_requests`).

    The planner coalesces within a chunk; consecutive chunks often continue where the last
    one stopped (storage order, block runs), so one storage read can serve several chunks.
    Groups start small: the ``k``-th holds at most ``2 ** k`` requests, so the first chunk is
    one read of its own (the first batch waits for it, not for the chunks merged after it).
    Pure and synchronous, so a plan can count the reads a run will make.
    """

    def __init__(self, gap_bytes: int, max_bytes: int, max_group: int = 64) -> None:
        self.gap_bytes, self.max_bytes, self.max_group = gap_bytes, max_bytes, max_group
        self.group: list[RangeRequest] = []
        self.stop = 0
        self.made = 0

    def add(self, request: RangeRequest) -> list[list[RangeRequest]]:
        """The groups that ``request`` completes (it may join the open one)."""
        group = self.group
        out: list[list[RangeRequest]] = []
        if len(request.ranges) == 1:
            ((start, end),) = request.ranges
            if (
                group
                and request.uri == group[0].uri
                and request.version == group[0].version
                and start >= group[0].ranges[0][0]
                and start - self.stop <= self.gap_bytes
                and end - group[0].ranges[0][0] <= self.max_bytes
                and len(group) < min(self.max_group, 1 << min(self.made, 16))
            ):
                group.append(request)
                self.stop = max(self.stop, end)
                return out
            if group:
                out.append(group)
                self.made += 1
            self.group, self.stop = [request], end
            return out
        if group:
            out.append(group)
            self.made += 1
            self.group = []
        out.append([request])
        self.made += 1
        return out

    def finish(self) -> list[list[RangeRequest]]:
        """The open group, if any."""
        out, self.group = ([self.group] if self.group else []), []
        return out


def group_reads(group: list[RangeRequest]) -> tuple[int, int]:
    """Storage reads and bytes of one group: a merged run is one read of its span."""
    if len(group) == 1:
        return len(group[0].ranges), sum(b - a for a, b in group[0].ranges)
    start, stop = group[0].ranges[0][0], max(r.ranges[0][1] for r in group)
    return 1, stop - start

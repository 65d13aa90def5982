"""One lane's curriculum, planned chunk by chunk: mixing, locating, coalescing.

A lane draws every dataset from its fair share of that dataset's multi-pass order
(:class:`~zephon.plan.lanes.LaneSplit`), mixed by the exact greedy schedule; in a finite
curriculum each dataset has a quota (the lane's share of its global draw count) and drops out
of the mixture once it is drawn, and the lane ends when every quota is met.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from zephon.plan.coalesce import PlannedReads, coalesce_chunks
from zephon.plan.lanemix import LaneMix
from zephon.plan.manifest import Manifest
from zephon.refs import Cursor, RangeRequest

if TYPE_CHECKING:
    from zephon.plan.relane import Draws
    from zephon.plan.worksource import StaticMixtureWorkSource

__all__ = ["LanePlanner", "WorkChunk"]

CHUNKS_AT_ONCE = 8  # chunks a lane plans in one numpy pass (sample mixtures), at most
# Planning between two returns to the event loop (StaticMixtureWorkSource.requests).
# Returning after every chunk paced the planner with consumption (one chunk per loop
# iteration), so a shard's reads were issued only as the one before was being consumed,
# whatever the fetch concurrency allowed.
PLAN_SLICE_S = 0.001


class WorkChunk:
    """One planned chunk of a lane: its cursor, pointer arrays and reads.

    ``reads`` holds the coalesced reads in columns; ``requests`` makes (once) the
    :class:`RangeRequest` objects.
    """

    __slots__ = (
        "_manifests",
        "_requests",
        "cursor",
        "datasets",
        "next_cursor",
        "passes",
        "reads",
        "samples",
        "shards",
    )

    def __init__(
        self,
        cursor: Cursor,
        datasets: np.ndarray,
        shards: np.ndarray,
        samples: np.ndarray,
        reads: PlannedReads,
        next_cursor: Cursor,
        manifests: Sequence[Manifest],
        passes: np.ndarray | None = None,
    ) -> None:
        self.cursor = cursor
        self.datasets = datasets
        self.shards = shards
        self.samples = samples
        # per pointer, the pass of its dataset it was drawn in
        self.passes = np.zeros(len(datasets), np.int64) if passes is None else passes
        self.reads = reads
        self.next_cursor = next_cursor
        self._manifests = manifests
        self._requests: list[RangeRequest] | None = None

    def __len__(self) -> int:
        return len(self.datasets)

    @property
    def requests(self) -> list[RangeRequest]:
        if self._requests is None:
            self._requests = self.reads.materialize(
                self._manifests, self.cursor, len(self), self.passes
            )
        return self._requests


def _reuse(source: StaticMixtureWorkSource, cache_bytes: int) -> float | None:
    """For a global shuffle, the chance that bytes read between two samples of a chunk are
    drawn by a later chunk while a range cache of ``cache_bytes`` still holds them: about the
    share of the data the cache holds (reads fetching up to 1.3x what they carry). ``None``
    for other shuffles, whose chunks draw a gap's samples soon (runs, blocks, shards)."""
    if source.shuffle != "global":
        return None
    total = sum(s.size_bytes for d in source.datasets for s in getattr(d, "shards", ()))
    return min(1.0, cache_bytes / (1.3 * total)) if total and cache_bytes > 0 else 0.0


class LanePlanner:
    """Plans lane ``lane`` of a work source whose datasets are split by ``splits``."""

    def __init__(
        self,
        source: StaticMixtureWorkSource,
        lane: int,
        splits: Sequence[Draws],
        chunks_at_once: int | None = None,
        window_bytes: int | None = None,
        origin: float = 0,
        cache_bytes: int = 0,
    ) -> None:
        self.source = source
        self.window_bytes = window_bytes  # see coalesce_chunks
        self.reuse = _reuse(source, cache_bytes)
        self.lane = lane
        self.splits = splits
        self.at_once = CHUNKS_AT_ONCE if chunks_at_once is None else chunks_at_once
        quotas = [s.quota(lane) for s in splits]
        self.quotas: list[int | None] | None = None if all(q is None for q in quotas) else quotas
        self.mix = LaneMix(
            source.phases,
            source.mixture_unit,
            lane,
            splits[0].lanes,
            origin,
            self.quotas,
            source.renormalize,
        )

    def chunks(self, cursor: Cursor) -> Iterator[WorkChunk]:
        """Chunks from ``cursor`` to the end of the lane's curriculum (or forever).

        Sample mixtures are planned 1, 2, 4, ... up to ``at_once`` chunks at a time, more
        only while a call takes under :data:`PLAN_SLICE_S`: the first chunk comes without
        waiting for the ones after it, and a chunk that spans many passes of a small dataset
        (each pass a few permutations to set up) holds the event loop for one chunk's
        planning, not eight. The chunks are the same however they are grouped."""
        count = 1
        while True:
            if self.source.mixture_unit == "tokens":  # picks depend on the chunk before
                chunk = self._plan_token_chunk(cursor)
                planned = [] if chunk is None else [chunk]
            else:
                began = time.perf_counter()
                planned = self._plan_chunks(cursor, count)
                fast = time.perf_counter() - began < PLAN_SLICE_S
                count = min(2 * count, self.at_once) if fast else max(1, count // 2)
            if not planned:
                return
            yield from planned
            cursor = planned[-1].next_cursor

    def _room(self, counts: Sequence[int]) -> list[int | None] | None:
        if self.quotas is None:
            return None
        return [None if q is None else q - c for q, c in zip(self.quotas, counts, strict=True)]

    def _plan_chunks(self, cursor: Cursor, count: int) -> list[WorkChunk]:
        """The next ``count`` chunks (fewer at the end) of a sample mixture, planned in one
        pass: mixing, locating and coalescing are per-pointer functions, so planning chunks
        together gives exactly the chunks planned one by one, for a fraction of the numpy
        calls per chunk (which dominate for chunks of a thousand pointers)."""
        src = self.source
        k, n = len(src.manifests), src.chunk_size
        counts = np.array(cursor.counts, dtype=np.int64)
        picks, marks = self.mix.sample_picks(cursor.counts, cursor.base, n * count)
        total = len(picks)
        if total == 0:
            return []
        taken = np.bincount(picks, minlength=k)
        drawn = np.flatnonzero(taken).tolist()
        if len(drawn) == 1:  # one dataset (or one's turn): its pointers, no masks
            shards, samples, passes = self._locate(drawn[0], int(counts[drawn[0]]), total)
        else:
            shards = np.empty(total, np.int64)
            samples = np.empty(total, np.int64)
            passes = np.empty(total, np.int64)
            for d in drawn:
                where = picks == d
                shards[where], samples[where], passes[where] = self._locate(
                    d, int(counts[d]), int(taken[d])
                )
        reads = coalesce_chunks(
            src.manifests,
            picks,
            shards,
            samples,
            src.coalesce_gap_bytes,
            src.max_request_bytes,
            n,
            self.window_bytes,
            self.reuse,
        )
        chunks = len(reads)
        if len(drawn) == 1:  # every pointer is that dataset's: chunk lengths are the counts
            per_chunk = np.zeros((chunks, k), np.int64)
            per_chunk[:, drawn[0]] = np.diff(np.minimum(np.arange(chunks + 1) * n, total))
        else:
            per_chunk = np.bincount(
                (np.arange(total) // n) * k + picks, minlength=chunks * k
            ).reshape(chunks, k)
        after = (counts + np.cumsum(per_chunk, axis=0)).tolist()
        out = []
        m = 0  # the segment mark in effect at the chunk's end
        for j in range(chunks):
            a, b = j * n, min(total, (j + 1) * n)
            while m + 1 < len(marks) and marks[m + 1][0] <= b:
                m += 1
            nxt = Cursor(
                cursor.lane,
                cursor.chunk + 1,
                cursor.position + b - a,
                tuple(after[j]),
                base=marks[m][1],
            )
            out.append(
                WorkChunk(
                    cursor,
                    picks[a:b],
                    shards[a:b],
                    samples[a:b],
                    reads[j],
                    nxt,
                    src.manifests,
                    passes[a:b],
                )
            )
            cursor = nxt
        return out

    def _plan_token_chunk(self, cursor: Cursor) -> WorkChunk | None:
        """The next chunk of a token mixture: its picks depend on the byte sizes of the
        samples each dataset would give next, so it is planned alone."""
        src = self.source
        assert cursor.tokens is not None
        k, n = len(src.manifests), src.chunk_size
        counts = np.array(cursor.counts, dtype=np.int64)
        room = self._room(cursor.counts)
        want = [n if r is None else max(0, min(n, r)) for r in (room or [None] * k)]
        ratios = src._ratios()
        located = [self._locate(d, int(counts[d]), want[d]) for d in range(k)]
        upcoming = [src.manifests[d].sample_nbytes(*located[d][:2]) * ratios[d] for d in range(k)]
        base = None
        if cursor.base is not None:
            base = (cursor.base, cursor.base_tokens or (0.0,) * k)
        picks, tokens_after, last = self.mix.token_picks(
            cursor.counts, cursor.tokens, base, upcoming, n
        )
        if len(picks) == 0:
            return None
        taken = np.bincount(picks, minlength=k)
        shards = np.empty(len(picks), np.int64)
        samples = np.empty(len(picks), np.int64)
        passes = np.empty(len(picks), np.int64)
        for d in range(k):
            got = int(taken[d])
            if got:
                shards[picks == d] = located[d][0][:got]
                samples[picks == d] = located[d][1][:got]
                passes[picks == d] = located[d][2][:got]
        nxt = Cursor(
            cursor.lane,
            cursor.chunk + 1,
            cursor.position + len(picks),
            tuple(int(c) for c in counts + taken),
            tuple(tokens_after),
            None if last is None else last[0],
            None if last is None else last[1],
        )
        (reads,) = coalesce_chunks(
            src.manifests,
            picks,
            shards,
            samples,
            src.coalesce_gap_bytes,
            src.max_request_bytes,
            len(picks),
            self.window_bytes,
            self.reuse,
        )
        return WorkChunk(cursor, picks, shards, samples, reads, nxt, src.manifests, passes)

    def _locate(self, d: int, first: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(shards, samples, passes)`` of the lane's draws ``first .. first + n`` of
        dataset ``d``."""
        src = self.source
        passes, ranks = self.splits[d].ranks(self.lane, first + np.arange(n, dtype=np.int64))
        order = src.orders[d]
        if n == 0 or (passes[0] == passes[-1] and (passes == passes[0]).all()):
            key = src.exhaustion.pass_key(d, int(passes[0]) if n else 0)
            shards, samples = order.locate(key, ranks)
        else:
            drawn, which = np.unique(passes, return_inverse=True)
            keys = [src.exhaustion.pass_key(d, int(p)) for p in drawn.tolist()]
            shards, samples = order.locate_passes(keys, which.astype(np.int64), ranks)
        return shards, src.manifests[d].kept(shards, samples), passes

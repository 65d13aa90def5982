"""StaticMixtureWorkSource: the curriculum as a pure function, served as range requests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from fractions import Fraction
from typing import Any

import numpy as np

from zephon.errors import ConfigError, StateMismatch
from zephon.formats.index import RowGroupIndex
from zephon.plan.arrays import distinct
from zephon.plan.coalesce import PlannedReads, coalesce_chunks
from zephon.plan.lanes import LaneSplit
from zephon.plan.manifest import Manifest
from zephon.plan.mixture import SampleSchedule, TokenSchedule, rational_weights
from zephon.plan.order import SHUFFLES, DatasetOrder
from zephon.refs import Cursor, RangeRequest

__all__ = ["StaticMixtureWorkSource", "WorkChunk"]

_POLICIES = ("repeat", "stop")
_UNITS = ("samples", "tokens")


class WorkChunk:
    """One planned chunk of a lane: its cursor, pointer arrays and reads.

    ``reads`` holds the coalesced reads in columns; ``requests`` makes (once) the
    :class:`RangeRequest` objects.
    """

    __slots__ = ("_manifests", "_requests", "cursor", "datasets", "next_cursor", "reads",
                 "samples", "shards")  # fmt: skip

    def __init__(
        self,
        cursor: Cursor,
        datasets: np.ndarray,
        shards: np.ndarray,
        samples: np.ndarray,
        reads: PlannedReads,
        next_cursor: Cursor,
        manifests: Sequence[Manifest],
    ) -> None:
        self.cursor = cursor
        self.datasets = datasets
        self.shards = shards
        self.samples = samples
        self.reads = reads
        self.next_cursor = next_cursor
        self._manifests = manifests
        self._requests: list[RangeRequest] | None = None

    def __len__(self) -> int:
        return len(self.datasets)

    @property
    def requests(self) -> list[RangeRequest]:
        if self._requests is None:
            self._requests = self.reads.materialize(self._manifests, self.cursor, len(self))
        return self._requests


_RUN_TARGET_BYTES = 4 << 20
_CHUNKS_AT_ONCE = 8  # chunks a lane plans in one numpy pass (sample mixtures)
# Planning between two returns to the event loop. Returning after every chunk paced the
# planner with consumption (one chunk per loop iteration), so a shard's reads were issued
# only as the one before was being consumed, whatever the fetch concurrency allowed.
_PLAN_SLICE_S = 0.001


def _default_run(manifest: Manifest, chunk_size: int, block_size: int) -> int:
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
        sample_bytes = _mean_sample_bytes(manifest)
        want = max(chunk_size // 16, math.ceil(_RUN_TARGET_BYTES / max(1.0, sample_bytes)))
    # A block (or a dataset smaller than one) holds at least four runs to move around.
    want = max(1, min(want, min(block_size, manifest.num_samples) // 4 or 1))
    if want >= chunk_size:
        return chunk_size * (want // chunk_size)
    return max(d for d in range(1, want + 1) if chunk_size % d == 0)


def _mean_group_bytes(manifest: Manifest) -> float:
    sizes = [
        float(x.group_nbytes.mean())
        for x in manifest.layouts[:64]
        if isinstance(x, RowGroupIndex) and len(x.group_nbytes)
    ]
    return float(np.mean(sizes)) if sizes else float(_RUN_TARGET_BYTES)


def _mean_sample_bytes(manifest: Manifest) -> float:
    probe = min(manifest.num_shards, 16)
    shards = np.repeat(np.arange(probe), 1)
    counts = manifest.shard_samples[:probe]
    if not manifest.all_records or counts.sum() == 0:
        return 1024.0
    starts, _ = manifest.spans(shards, np.zeros(probe, dtype=np.int64))
    _, stops = manifest.spans(shards, np.maximum(counts - 1, 0))
    total = float((stops - starts)[counts > 0].sum())
    return total / float(counts.sum())


class StaticMixtureWorkSource:
    """A fixed mixture of datasets: what to read, in which order, how often.

    The curriculum is a pure function of the datasets' manifests and these arguments; it plans
    from metadata only and never materialises anything proportional to the number of samples.

    Args:
        datasets: :class:`~zephon.dataset.Dataset` objects (or planner
            :class:`~zephon.plan.manifest.Manifest` objects), with distinct names.
        mixture: ``{name: weight}``, relative, normalised; default proportional to size.
        seed: keys every permutation.
        shuffle: ``"none"``, ``"shards"``, ``"block"`` or ``"global"``.
        block_size: samples per shuffle block (``block``); ``None``: four mean shards, at
            least ``chunk_size``, rounded up to a multiple of it.
        run_size: consecutive samples kept together by ``block`` shuffling (read together);
            must divide ``chunk_size`` or be a multiple of it. ``None``: about 4 MiB of samples
            for record formats (a sixteenth of a chunk at least, a quarter of a block at
            most), a row group for Parquet, whose read unit is a row group.
        chunk_size: pointers per work chunk (also the lane split's unit).
        exhausted_policy: ``"repeat"`` (datasets loop until every one completed
            ``stop_after_passes`` passes) or ``"stop"`` (end when any dataset is exhausted).
        stop_after_passes: passes per dataset; ``None`` for an infinite curriculum.
        mixture_unit: ``"samples"``, or ``"tokens"`` (weights are token shares).
        tokens_per_byte: per dataset, for token mixtures; datasets left out are measured by
            the pipeline's ``tokenize`` step before planning (:meth:`calibrate`).
        coalesce_gap_bytes: neighbouring samples of a shard at most this far apart share a read.
        max_request_bytes: a coalesced read grows no larger (a single larger sample still
            gets its own read).

    Raises:
        ConfigError: any invalid argument, naming it.
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        mixture: Mapping[str, float] | None = None,
        *,
        seed: int = 0,
        shuffle: str = "block",
        block_size: int | None = None,
        run_size: int | None = None,
        chunk_size: int = 1024,
        exhausted_policy: str = "repeat",
        stop_after_passes: int | None = 1,
        mixture_unit: str = "samples",
        tokens_per_byte: Mapping[str, float] | None = None,
        coalesce_gap_bytes: int = 64 * 1024,
        max_request_bytes: int = 8 << 20,
    ) -> None:
        if not datasets:
            raise ConfigError("datasets: need at least one dataset")
        self.datasets = list(datasets)
        self.manifests = [
            d if isinstance(d, Manifest) else Manifest.from_dataset(d) for d in datasets
        ]
        names = [m.name for m in self.manifests]
        if len(set(names)) != len(names):
            raise ConfigError(f"datasets: names must be distinct, got {names}")
        if shuffle not in SHUFFLES:
            raise ConfigError(f"shuffle must be one of {SHUFFLES}, got {shuffle!r}")
        if exhausted_policy not in _POLICIES:
            raise ConfigError(
                f"exhausted_policy must be one of {_POLICIES}, got {exhausted_policy!r}"
            )
        if mixture_unit not in _UNITS:
            raise ConfigError(f"mixture_unit must be one of {_UNITS}, got {mixture_unit!r}")
        if chunk_size < 1:
            raise ConfigError(f"chunk_size must be >= 1, got {chunk_size}")
        if stop_after_passes is not None and stop_after_passes < 1:
            raise ConfigError(f"stop_after_passes must be >= 1 or None, got {stop_after_passes}")
        if block_size is not None and block_size < 1:
            raise ConfigError(f"block_size must be >= 1 or None, got {block_size}")
        if coalesce_gap_bytes < 0 or max_request_bytes < 1:
            raise ConfigError("coalesce_gap_bytes must be >= 0 and max_request_bytes >= 1")
        empty = [m.name for m in self.manifests if m.num_samples == 0]
        if empty:
            raise ConfigError(f"datasets {empty} have no samples")
        self.names = names
        self.seed = seed
        self.shuffle = shuffle
        self.chunk_size = chunk_size
        self.exhausted_policy = exhausted_policy
        self.stop_after_passes = stop_after_passes
        self.mixture_unit = mixture_unit
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_request_bytes = max_request_bytes
        self.weights = self._weights(mixture)
        self.tokens_per_byte = self._tokens_per_byte(tokens_per_byte)
        if run_size is not None and (
            run_size < 1 or (chunk_size % run_size and run_size % chunk_size)
        ):
            raise ConfigError(
                f"run_size must divide chunk_size ({chunk_size}) or be a multiple of it, "
                f"got {run_size}"
            )
        self.block_sizes = [
            block_size
            or chunk_size * math.ceil(4 * m.num_samples / max(1, m.num_shards) / chunk_size)
            for m in self.manifests
        ]
        self.run_sizes = [
            run_size or _default_run(m, chunk_size, b)
            for m, b in zip(self.manifests, self.block_sizes, strict=True)
        ]
        self.orders = [
            DatasetOrder(m, shuffle, seed, b, chunk_size, r)
            for m, b, r in zip(self.manifests, self.block_sizes, self.run_sizes, strict=True)
        ]
        self._samples = SampleSchedule(self.weights) if mixture_unit == "samples" else None
        self._tokens = TokenSchedule(self.weights) if mixture_unit == "tokens" else None

    def _weights(self, mixture: Mapping[str, float] | None) -> list[Fraction]:
        if mixture is None:
            return rational_weights([m.num_samples for m in self.manifests])
        unknown = sorted(set(mixture) - set(self.names))
        missing = sorted(set(self.names) - set(mixture))
        if unknown or missing:
            raise ConfigError(
                f"mixture names must match the datasets {self.names}: "
                f"unknown {unknown}, missing {missing}"
            )
        bad = {k: v for k, v in mixture.items() if not (isinstance(v, int | float) and v > 0)}
        if bad:
            raise ConfigError(f"mixture weights must be positive numbers, got {bad}")
        return rational_weights([mixture[n] for n in self.names])

    def _tokens_per_byte(self, given: Mapping[str, float] | None) -> list[float | None] | None:
        if self.mixture_unit != "tokens":
            if given is not None:
                raise ConfigError("tokens_per_byte applies only with mixture_unit='tokens'")
            return None
        given = dict(given or {})
        unknown = sorted(set(given) - set(self.names))
        if unknown:
            raise ConfigError(f"tokens_per_byte names unknown datasets {unknown}")
        if any(not v > 0 for v in given.values()):
            raise ConfigError(f"tokens_per_byte must be positive, got {given}")
        # Datasets left out are measured later: see calibrate().
        return [float(given[n]) if n in given else None for n in self.names]

    def uncalibrated(self) -> list[str]:
        """Datasets of a token mixture whose tokens-per-byte ratio is not known yet."""
        if self.tokens_per_byte is None:
            return []
        return [n for n, r in zip(self.names, self.tokens_per_byte, strict=True) if r is None]

    def calibrate(self, ratios: Mapping[str, float]) -> None:
        """Set measured tokens-per-byte ratios of the datasets that lack one (given ratios
        stay). Done once, before planning: from then on the ratios are part of the
        curriculum (:meth:`describe`), frozen into every checkpoint."""
        if self.tokens_per_byte is None:
            raise ConfigError("calibrate() applies only with mixture_unit='tokens'")
        bad = {k: v for k, v in ratios.items() if k not in self.names or not v > 0}
        if bad:
            raise ConfigError(f"calibrate(): unknown datasets or non-positive ratios {bad}")
        self.tokens_per_byte = [
            r if r is not None else (float(ratios[n]) if n in ratios else None)
            for n, r in zip(self.names, self.tokens_per_byte, strict=True)
        ]

    def _ratios(self) -> list[float]:
        missing = self.uncalibrated()
        if missing:
            raise ConfigError(
                f"mixture_unit='tokens' needs tokens_per_byte for {missing}: pass them, or add "
                "a tokenize() step to the pipeline, which measures them"
            )
        assert self.tokens_per_byte is not None
        return [r for r in self.tokens_per_byte if r is not None]

    # -- identity and state -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Everything the curriculum is a function of (the manifests by fingerprint)."""
        return {
            "datasets": [[m.name, m.fingerprint] for m in self.manifests],
            "weights": [str(w) for w in self.weights],
            "seed": self.seed,
            "shuffle": self.shuffle,
            "block_sizes": self.block_sizes,
            "run_sizes": self.run_sizes,
            "chunk_size": self.chunk_size,
            "exhausted_policy": self.exhausted_policy,
            "stop_after_passes": self.stop_after_passes,
            "mixture_unit": self.mixture_unit,
            "tokens_per_byte": self.tokens_per_byte,
        }

    def fingerprint(self) -> str:
        blob = json.dumps(self.describe(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def state(self, cursor: Cursor, delivered: int, lanes: int) -> dict[str, Any]:
        """JSON state of a lane after ``delivered`` pointers of the chunk at ``cursor``."""
        return {
            "source": self.fingerprint(),
            "describe": self.describe(),
            "lanes": lanes,
            "cursor": cursor.to_dict(),
            "delivered": delivered,
        }

    def check_state(self, state: Mapping[str, Any], lanes: int) -> tuple[Cursor, int]:
        """Validate a :meth:`state` dict for this source; returns ``(cursor, delivered)``.

        Raises:
            StateMismatch: it was taken from a different curriculum; the message says what.
        """
        try:
            theirs = state["describe"]
            cursor = Cursor.from_dict(state["cursor"])
            delivered = int(state["delivered"])
            their_lanes = int(state["lanes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateMismatch(f"not a work source state ({type(exc).__name__}: {exc})") from None
        ours = self.describe()
        diffs = [
            f"{key}: checkpoint has {theirs.get(key)!r}, this source has {ours[key]!r}"
            for key in ours
            if json.dumps(theirs.get(key), sort_keys=True) != json.dumps(ours[key], sort_keys=True)
        ]
        if their_lanes != lanes:
            diffs.append(f"lanes: checkpoint has {their_lanes}, this run has {lanes}")
        if diffs:
            raise StateMismatch("checkpoint does not match this work source: " + "; ".join(diffs))
        if len(cursor.counts) != len(self.manifests):
            raise StateMismatch("checkpoint cursor counts do not match the dataset list")
        return cursor, delivered

    def start(self, lane: int) -> Cursor:
        """The cursor of a lane's first chunk."""
        zeros = tuple(0 for _ in self.manifests)
        tokens = tuple(0.0 for _ in self.manifests) if self._tokens is not None else None
        return Cursor(lane, 0, 0, zeros, tokens)

    # -- planning ---------------------------------------------------------------------

    def _splits(self, lanes: int) -> list[LaneSplit]:
        splits = [LaneSplit.of(m.num_samples, lanes, self.chunk_size) for m in self.manifests]
        small = [
            m.name for m, s in zip(self.manifests, splits, strict=True) if m.num_samples < lanes
        ]
        if small:
            raise ConfigError(f"datasets {small} have fewer samples than lanes ({lanes})")
        return splits

    def chunks(
        self, lane: int = 0, lanes: int = 1, start: Cursor | None = None
    ) -> Iterator[WorkChunk]:
        """Plan lane ``lane`` of ``lanes`` chunk by chunk from ``start`` (default: the start).

        A pure, synchronous generator: the same arguments give the same chunks.
        """
        if not 0 <= lane < lanes:
            raise ConfigError(f"lane must be in [0, {lanes}), got {lane}")
        splits = self._splits(lanes)
        limits = None
        if self.stop_after_passes is not None:
            limits = np.array([s.lane_size(lane) * self.stop_after_passes for s in splits])
        cursor = start or self.start(lane)
        if cursor.lane != lane:
            raise ConfigError(f"cursor is for lane {cursor.lane}, not {lane}")
        while True:
            if self._tokens is not None:  # each chunk's picks depend on the one before
                chunk = self._plan_token_chunk(cursor, splits, limits)
                planned = [] if chunk is None else [chunk]
            else:
                planned = self._plan_chunks(cursor, splits, limits, _CHUNKS_AT_ONCE)
            if not planned:
                return
            yield from planned
            cursor = planned[-1].next_cursor

    def _plan_chunks(
        self,
        cursor: Cursor,
        splits: list[LaneSplit],
        limits: np.ndarray | None,
        count: int,
    ) -> list[WorkChunk]:
        """The next ``count`` chunks (fewer at the end) of a sample mixture, planned in one
        pass: mixing, locating and coalescing are per-pointer functions, so planning chunks
        together gives exactly the chunks planned one by one, for a fraction of the numpy
        calls per chunk (which dominate for chunks of a thousand pointers)."""
        assert self._samples is not None
        k = len(self.manifests)
        counts = np.array(cursor.counts, dtype=np.int64)
        if self._exhausted(counts, limits):
            return []
        n = self.chunk_size
        picks = self._samples.picks(cursor.counts, n * count)
        if limits is not None:
            picks = self._truncate(picks, counts, limits)
        total = len(picks)
        shards = np.empty(total, np.int64)
        samples = np.empty(total, np.int64)
        taken = np.bincount(picks, minlength=k)
        for d in np.flatnonzero(taken).tolist():
            where = picks == d
            shards[where], samples[where] = self._locate(
                d, cursor.lane, splits[d], counts[d], int(taken[d])
            )
        reads = coalesce_chunks(
            self.manifests,
            picks,
            shards,
            samples,
            self.coalesce_gap_bytes,
            self.max_request_bytes,
            n,
        )
        chunks = len(reads)
        per_chunk = np.bincount((np.arange(total) // n) * k + picks, minlength=chunks * k).reshape(
            chunks, k
        )
        after = (counts + np.cumsum(per_chunk, axis=0)).tolist()
        out = []
        for j in range(chunks):
            a, b = j * n, min(total, (j + 1) * n)
            nxt = Cursor(cursor.lane, cursor.chunk + 1, cursor.position + b - a, tuple(after[j]))
            out.append(WorkChunk(cursor, picks[a:b], shards[a:b], samples[a:b], reads[j], nxt,
                                 self.manifests))  # fmt: skip
            cursor = nxt
        return out

    def _plan_token_chunk(
        self, cursor: Cursor, splits: list[LaneSplit], limits: np.ndarray | None
    ) -> WorkChunk | None:
        """The next chunk of a token mixture: its picks depend on the byte sizes of the
        samples each dataset would give next, so it is planned alone."""
        assert self._tokens is not None and cursor.tokens is not None
        k = len(self.manifests)
        counts = np.array(cursor.counts, dtype=np.int64)
        if self._exhausted(counts, limits):
            return None
        n = self.chunk_size
        ratios = self._ratios()
        located = [self._locate(d, cursor.lane, splits[d], counts[d], n) for d in range(k)]
        upcoming = [self.manifests[d].sample_nbytes(*located[d]) * ratios[d] for d in range(k)]
        picks, _ = self._tokens.picks(cursor.tokens, upcoming, n)
        if limits is not None:
            picks = self._truncate(picks, counts, limits)
        taken = np.bincount(picks, minlength=k)
        shards = np.empty(len(picks), np.int64)
        samples = np.empty(len(picks), np.int64)
        for d in np.flatnonzero(taken).tolist():
            shards[picks == d] = located[d][0][: taken[d]]
            samples[picks == d] = located[d][1][: taken[d]]
        tokens_after = tuple(
            cursor.tokens[d]
            + float(
                self.manifests[d]
                .sample_nbytes(located[d][0][: taken[d]], located[d][1][: taken[d]])
                .sum()
            )
            * ratios[d]
            for d in range(k)
        )
        next_cursor = Cursor(
            cursor.lane,
            cursor.chunk + 1,
            cursor.position + len(picks),
            tuple(int(c) for c in counts + taken),
            tokens_after,
        )
        (reads,) = coalesce_chunks(
            self.manifests,
            picks,
            shards,
            samples,
            self.coalesce_gap_bytes,
            self.max_request_bytes,
            len(picks),
        )
        return WorkChunk(cursor, picks, shards, samples, reads, next_cursor, self.manifests)

    def _exhausted(self, counts: np.ndarray, limits: np.ndarray | None) -> bool:
        """Whether a lane that has drawn ``counts`` is past the end of its curriculum."""
        if limits is None:
            return False
        done = counts >= limits
        return bool(done.any() if self.exhausted_policy == "stop" else done.all())

    def _locate(
        self, d: int, lane: int, split: LaneSplit, first: int, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        k = first + np.arange(n, dtype=np.int64)
        passes, ranks = split.ranks(lane, k)
        order = self.orders[d]
        if passes[0] == passes[-1]:
            return order.locate(int(passes[0]), ranks)
        shards = np.empty(n, np.int64)
        samples = np.empty(n, np.int64)
        for p in distinct(passes):
            mask = passes == p
            shards[mask], samples[mask] = order.locate(int(p), ranks[mask])
        return shards, samples

    def _truncate(self, picks: np.ndarray, counts: np.ndarray, limits: np.ndarray) -> np.ndarray:
        """``picks`` up to the pointer that ends the curriculum: the first at which any
        dataset (``stop``) or every dataset (``repeat``) has reached its limit."""
        reach: list[int | None] = []  # per dataset, the first position at its limit
        for d, need in enumerate((limits - counts).tolist()):
            if need <= 0:
                reach.append(0)
                continue
            where = np.flatnonzero(picks == d)
            reach.append(int(where[need - 1]) if len(where) >= need else None)
        hit = [r for r in reach if r is not None]
        if self.exhausted_policy == "stop":
            return picks[: min(hit) + 1] if hit else picks
        return picks[: max(hit) + 1] if len(hit) == len(reach) else picks

    async def requests(
        self, lane: int = 0, lanes: int = 1, *, resume: Mapping[str, Any] | None = None
    ) -> AsyncIterator[RangeRequest]:
        """Range requests of lane ``lane`` of ``lanes`` in curriculum order.

        With ``resume`` (a :meth:`state` dict), continues after the pointers it records as
        delivered. Planning is synchronous and cheap; control returns to the event loop once
        a millisecond of it has run (about eight chunks), so the other stages stay responsive
        while the requests run as far ahead as the consumer of this iterator lets them.
        """
        start, skip = (None, 0)
        if resume is not None:
            start, skip = self.check_state(resume, lanes)
        since = time.perf_counter()
        for chunk in self.chunks(lane, lanes, start):
            for request in chunk.requests:
                if skip and request.slots[0] < skip:
                    kept = request.slots >= skip
                    if not kept.any():
                        continue
                    request = request._replace(
                        samples=request.samples[kept], slots=request.slots[kept]
                    )
                yield request
            skip = 0
            if time.perf_counter() - since >= _PLAN_SLICE_S:
                await asyncio.sleep(0)
                since = time.perf_counter()

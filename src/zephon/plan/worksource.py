"""StaticMixtureWorkSource: the curriculum as a pure function, served as range requests."""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any

from zephon.choices import ExhaustedPolicy, MixtureUnit, ShuffleMode
from zephon.errors import ConfigError, StateMismatch
from zephon.plan.arguments import (
    check_arguments,
    check_budgets,
    mixture_phases,
    tokens_per_byte_of,
)
from zephon.plan.budget import Ends, curriculum_ends
from zephon.plan.coalesce import cut_requests
from zephon.plan.exhaustion import Exhaustion
from zephon.plan.future import FUTURE, FutureChecks
from zephon.plan.lanes import LaneSplit
from zephon.plan.manifest import Manifest
from zephon.plan.order import DatasetOrder
from zephon.plan.planner import PLAN_SLICE_S, LanePlanner, WorkChunk
from zephon.plan.ratios import TokenRatios
from zephon.plan.relane import Draws, Relaned
from zephon.plan.report import PlanReport, plan_report
from zephon.plan.runs import default_chunk, default_run
from zephon.plan.schedule import MixtureSchedule, Phase
from zephon.refs import Cursor, RangeRequest

__all__ = ["FUTURE", "StaticMixtureWorkSource", "WorkChunk"]


class StaticMixtureWorkSource(TokenRatios, FutureChecks):
    """A fixed mixture of datasets: what to read, in which order, how often.

    The curriculum is a pure function of the datasets' manifests and these arguments; it plans
    from metadata only and never materialises anything proportional to the number of samples.

    Args:
        datasets: :class:`~zephon.dataset.Dataset` objects (or planner
            :class:`~zephon.plan.manifest.Manifest` objects), with distinct names.
        mixture: ``{name: weight}``, relative, normalised; default proportional to size. Or
            a :class:`~zephon.MixtureSchedule`: weights that change at global positions
            (its unit is the mixture's).
        seed: keys every permutation.
        shuffle: ``"none"``, ``"shards"``, ``"block"`` or ``"global"``.
        block_size: samples per shuffle block (``block``); ``None``: four mean shards, at
            least ``chunk_size``, rounded up to a multiple of it.
        run_size: consecutive samples kept together by ``block`` shuffling (read together);
            must divide ``chunk_size`` or be a multiple of it. ``None``: about 4 MiB of samples
            for record formats (a sixteenth of a chunk at least, a quarter of a block at
            most), a row group for Parquet, whose read unit is a row group.
        chunk_size: pointers per work chunk (the lane split's unit). ``None``: ~16 MiB of
            samples, 256-1024 (:func:`~zephon.plan.runs.default_chunk`; Parquet: row groups).
        exhausted_policy: ``"repeat"`` (the dataset loops until every dataset completed
            ``stop_after_passes`` passes), ``"stop"`` (the curriculum ends when this dataset
            completes ``stop_after_passes`` passes, one if ``None``) or ``"drop"`` (the
            dataset leaves the mixture when it completes them, the others renormalise); a
            scalar or a ``{name: policy}`` mapping (datasets left out: ``"repeat"``).
        stop_after_passes: passes every dataset completes; ``None``: no such limit (the
            curriculum is infinite unless a ``stop`` policy or ``max_repeats`` ends it).
        max_repeats: ``N`` ends the curriculum when the dataset would start pass ``2 + N``;
            a scalar or a mapping (``None``: no limit).
        reshuffle_on_repeat: ``False`` keeps a dataset's order across passes; a scalar or a
            mapping (default ``True``: each pass has its own permutation).
        mixture_unit: ``"samples"``, or ``"tokens"`` (weights are token shares).
        tokens_per_byte: for token mixtures, one ratio for every dataset or a mapping per
            dataset; datasets left out are measured by the pipeline's ``tokenize`` step
            before planning (:meth:`calibrate`).
        max_samples: ``{name: n}``: the dataset leaves the mixture after ``n`` draws (the
            others renormalise).
        max_tokens: ``{name: n}``: the same in tokens (estimated from bytes as the token
            mixture does; converted to draws at the dataset's mean tokens per sample).
        epoch_size: the curriculum is this many samples of the mixture, whatever the
            datasets' sizes (each dataset's permutation continues through its passes); the
            epoch, not ``stop_after_passes``, ends it (passes still count for ``stop`` and
            ``drop`` datasets).
        coalesce_gap_bytes: neighbouring samples of a shard at most this far apart share a read.
        max_request_bytes: a coalesced read grows no larger (a single larger sample still
            gets its own read).

    Raises:
        ConfigError: any invalid argument, naming it.
    """

    def __init__(
        self,
        datasets: Sequence[Any],
        mixture: Mapping[str, float] | MixtureSchedule | None = None,
        *,
        seed: int = 0,
        shuffle: ShuffleMode = "block",
        block_size: int | None = None,
        run_size: int | None = None,
        chunk_size: int | None = None,
        exhausted_policy: ExhaustedPolicy | Mapping[str, ExhaustedPolicy] = "repeat",
        stop_after_passes: int | None = 1,
        max_repeats: int | Mapping[str, int | None] | None = None,
        reshuffle_on_repeat: bool | Mapping[str, bool] = True,
        mixture_unit: MixtureUnit = "samples",
        tokens_per_byte: Mapping[str, float] | float | None = None,
        max_samples: Mapping[str, int] | None = None,
        max_tokens: Mapping[str, int] | None = None,
        epoch_size: int | None = None,
        coalesce_gap_bytes: int = 64 * 1024,
        max_request_bytes: int = 8 << 20,
    ) -> None:
        if not datasets:
            raise ConfigError("datasets: need at least one dataset")
        self.datasets = list(datasets)
        self.manifests = [
            d if isinstance(d, Manifest) else Manifest.from_dataset(d) for d in datasets
        ]
        self.names = names = [m.name for m in self.manifests]
        sizes = [m.num_samples for m in self.manifests]
        self.mixture = mixture
        self.phases: list[Phase] = mixture_phases(names, sizes, mixture)
        if isinstance(mixture, MixtureSchedule):
            if mixture_unit != "samples" and mixture_unit != mixture.unit:
                raise ConfigError(
                    f"mixture_unit={mixture_unit!r} conflicts with the schedule's unit "
                    f"{mixture.unit!r}: the schedule's unit is the mixture's"
                )
            mixture_unit = mixture.unit
        self.weights = list(self.phases[0].weights)
        self.max_samples, self.max_tokens = check_budgets(names, max_samples, max_tokens)
        if epoch_size is not None and (
            isinstance(epoch_size, bool) or not isinstance(epoch_size, int) or epoch_size < 1
        ):
            raise ConfigError(f"epoch_size must be an int >= 1 or None, got {epoch_size!r}")
        self.epoch_size = epoch_size
        if chunk_size is None:
            shares = [float(w) for w in self.weights]
            chunk_size = default_chunk(self.manifests, mixture_unit, shares)
        check_arguments(
            self.manifests,
            shuffle,
            mixture_unit,
            chunk_size,
            block_size,
            run_size,
            coalesce_gap_bytes,
            max_request_bytes,
        )
        self.exhaustion = Exhaustion.of(
            names, exhausted_policy, max_repeats, reshuffle_on_repeat, stop_after_passes
        )
        self.seed = seed
        self.shuffle = shuffle
        self.chunk_size = chunk_size
        self.mixture_unit = mixture_unit
        self.coalesce_gap_bytes = coalesce_gap_bytes
        self.max_request_bytes = max_request_bytes
        self.tokens_per_byte = tokens_per_byte_of(
            names, mixture_unit, tokens_per_byte, self.max_tokens is not None
        )
        self.block_sizes = [
            block_size
            or chunk_size * math.ceil(4 * m.num_samples / max(1, m.num_shards) / chunk_size)
            for m in self.manifests
        ]
        self.run_sizes = [
            run_size or default_run(m, chunk_size, b)
            for m, b in zip(self.manifests, self.block_sizes, strict=True)
        ]
        self.orders = [
            DatasetOrder(m, shuffle, seed, b, chunk_size, r)
            for m, b, r in zip(self.manifests, self.block_sizes, self.run_sizes, strict=True)
        ]
        self.renormalize = self._renormalizes()
        self._ends: Ends | None = None  # end counts, computed when first planned

    def _renormalizes(self) -> bool:
        """A schedule, budgets, ``drop`` or an epoch size: a lane mixes in segments that
        renormalise (:mod:`zephon.plan.lanemix`); otherwise as a static mixture always has."""
        return (
            len(self.phases) > 1
            or self.max_samples is not None
            or self.max_tokens is not None
            or self.epoch_size is not None
            or "drop" in self.exhaustion.policies
        )

    # -- identity and state -----------------------------------------------------------

    def describe(self) -> dict[str, Any]:
        """Everything the curriculum is a function of (the manifests by fingerprint). What a
        static mixture does not use is left out, so its description is as it always was."""
        out: dict[str, Any] = {
            "datasets": [[m.name, m.fingerprint] for m in self.manifests],
            "weights": [str(w) for w in self.weights],
            "seed": self.seed,
            "shuffle": self.shuffle,
            "block_sizes": self.block_sizes,
            "run_sizes": self.run_sizes,
            "chunk_size": self.chunk_size,
            **self.exhaustion.describe(),
            "mixture_unit": self.mixture_unit,
            "tokens_per_byte": self.tokens_per_byte,
        }
        if len(self.phases) > 1:
            out["schedule"] = [p.describe() for p in self.phases]
        for name in ("max_samples", "max_tokens", "epoch_size"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out

    def fingerprint(self) -> str:
        """A short hash of :meth:`describe`: equal curricula have equal fingerprints."""
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

    def start(self, lane: int) -> Cursor:
        """The cursor of a lane's first chunk."""
        zeros = tuple(0 for _ in self.manifests)
        tokens = tuple(0.0 for _ in self.manifests) if self.mixture_unit == "tokens" else None
        return Cursor(lane, 0, 0, zeros, tokens)

    # -- planning ---------------------------------------------------------------------

    @property
    def exhausted_policy(self) -> str | dict[str, str]:
        """The policy: one string if every dataset has the same, else a mapping."""
        policies = self.exhaustion.policies
        if len(set(policies)) == 1:
            return policies[0]
        return dict(zip(self.names, policies, strict=True))

    @property
    def stop_after_passes(self) -> int | None:
        """Passes every dataset completes (``None``: no such limit)."""
        return self.exhaustion.passes

    def end_counts(self) -> list[int | None] | None:
        """Draws of every dataset over the whole curriculum (all lanes together), or
        ``None`` if it is infinite (see :mod:`zephon.plan.exhaustion` and, for schedules and
        budgets, :mod:`zephon.plan.budget`); a dataset with a budget in an otherwise
        infinite curriculum has its count, the others ``None``."""
        counts = self.ends().counts
        return None if all(c is None for c in counts) else counts

    def ends(self) -> Ends:
        """The curriculum's end counts, whether each dataset leaves before the end, and its
        length (computed once; :func:`~zephon.plan.budget.curriculum_ends`)."""
        if self._ends is None:
            self._ends = curriculum_ends(self)
        return self._ends

    def splits(self, lanes: int, history: Sequence[Mapping[str, Any]] = ()) -> list[Draws]:
        """How each dataset's draws are dealt to ``lanes`` lanes: fairly, with the longer
        pieces of each dataset starting where the previous dataset's ended. ``history``
        lists the re-laning generations since the start (see :mod:`zephon.plan.relane`):
        ``{"from_lanes", "lanes", "cuts"}``, cuts per dataset per old lane."""
        totals = self._generation_ends(history)
        first = int(history[0]["from_lanes"]) if history else lanes
        out: list[Draws] = []
        offset = 0  # each generation's staircase runs over the datasets in order
        for d, m in enumerate(self.manifests):
            out.append(LaneSplit.of(m.num_samples, first, self.chunk_size, offset, totals[0][d]))
            offset += out[-1].extras()
        for g, gen in enumerate(history):
            offset = 0
            for d, m in enumerate(self.manifests):
                out[d] = Relaned(
                    out[d],
                    [int(c) for c in gen["cuts"][d]],
                    int(gen["lanes"]),
                    self.chunk_size,
                    m.num_samples,
                    offset,
                    totals[g + 1][d] is None,
                    totals[g + 1][d],
                )
                offset += out[d].extras()
        if out[0].lanes != lanes:
            raise StateMismatch(f"the re-laning history ends at {out[0].lanes} lanes, not {lanes}")
        return out

    def chunks(
        self,
        lane: int = 0,
        lanes: int = 1,
        start: Cursor | None = None,
        history: Sequence[Mapping[str, Any]] = (),
        window_bytes: int | None = None,
        cache_bytes: int = 0,
    ) -> Iterator[WorkChunk]:
        """Plan lane ``lane`` of ``lanes`` chunk by chunk from ``start`` (default: the start),
        after the re-laning ``history`` (default: none). ``window_bytes`` (default
        ``max_request_bytes``): a chunk of large records is read within windows of about
        this many bytes of the curriculum; ``cache_bytes``: the range cache the reads go
        through (a global shuffle reads through larger gaps the more of the data it holds).
        Both change the reads, never the samples.

        A pure, synchronous generator: the same arguments give the same chunks.
        """
        if not 0 <= lane < lanes:
            raise ConfigError(f"lane must be in [0, {lanes}), got {lane}")
        cursor = start or self.start(lane)
        if cursor.lane != lane:
            raise ConfigError(f"cursor is for lane {cursor.lane}, not {lane}")
        planner = LanePlanner(
            self,
            lane,
            self.splits(lanes, history),
            window_bytes=window_bytes,
            origin=self.origin(history),
            cache_bytes=cache_bytes,
        )
        return planner.chunks(cursor)

    def report(
        self,
        lanes: int = 1,
        *,
        samples: int | None = None,
        get_price_per_1000: float = 0.0004,
        egress_price_per_gib: float = 0.0,
    ) -> PlanReport:
        """The plan before the run, planned from metadata only: per dataset and phase,
        samples and estimated tokens; passes and repeats; the global positions of each
        dataset's first and last draws; the reads and bytes the run fetches and their cost
        at the given prices. ``samples``: how far to plan (needed when the curriculum has no
        end). ``report.text()`` prints it, ``report.plot(path)`` draws it (matplotlib).
        A run over ``lanes`` lanes that reads to the end delivers exactly these counts."""
        return plan_report(
            self,
            lanes,
            samples=samples,
            get_price_per_1000=get_price_per_1000,
            egress_price_per_gib=egress_price_per_gib,
        )

    async def requests(
        self,
        lane: int = 0,
        lanes: int = 1,
        *,
        resume: Mapping[str, Any] | None = None,
        history: Sequence[Mapping[str, Any]] = (),
        until: int | None = None,
        window_bytes: int | None = None,
        cache_bytes: int = 0,
    ) -> AsyncIterator[RangeRequest]:
        """Range requests of lane ``lane`` of ``lanes`` in curriculum order.

        With ``resume`` (a :meth:`state` dict), continues after the pointers it records as
        delivered; ``history`` is the re-laning history (:meth:`splits`); ``until``: stop
        before the lane's pointer at that position (counted from the lane's start);
        ``window_bytes`` and ``cache_bytes`` as in :meth:`chunks`. Planning is
        synchronous and cheap; control returns to the event loop once
        a millisecond of it has run (about eight chunks), so the other stages stay responsive
        while the requests run as far ahead as the consumer of this iterator lets them.
        """
        start, skip = (None, 0)
        if resume is not None:
            start, skip = self.check_state(resume, lanes)
        since = time.perf_counter()
        for chunk in self.chunks(lane, lanes, start, history, window_bytes, cache_bytes):
            end = chunk.cursor.position + len(chunk) if until is None else until
            if end <= chunk.cursor.position:
                return
            stop = end - chunk.cursor.position
            requests = chunk.requests
            if skip or stop < len(chunk):
                requests = cut_requests(requests, skip, stop)
            for request in requests:
                yield request
            skip = 0
            if time.perf_counter() - since >= PLAN_SLICE_S:
                await asyncio.sleep(0)
                since = time.perf_counter()

"""The plan before the run: what a curriculum will read, in what mixture, at what cost.

:func:`plan_report` plans every lane of a work source (metadata only, nothing is fetched) and
adds up what the run will deliver: per dataset and per phase of the schedule, samples and
estimated tokens; per dataset, the passes it starts and the global positions of its first
and last draws; the reads and bytes the run fetches and what they cost at a given price.
The figures are the planner's own, so a run that reads to the end delivers exactly them.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from zephon.errors import ConfigError
from zephon.plan.coalesce import ReadGroups, cut_requests, group_reads

if TYPE_CHECKING:
    from zephon.plan.worksource import StaticMixtureWorkSource

__all__ = ["DatasetPlan", "PlanReport", "plan_report", "read_amplification"]


@dataclass
class DatasetPlan:
    """One dataset's part of the run."""

    name: str
    size: int  # samples in one pass
    samples: int = 0
    tokens: float | None = None  # estimated from bytes (None: no tokens-per-byte ratio)
    passes: int = 0  # passes the run starts (1: read once or less; 3: two repeats)
    first: int | None = None  # global position of its first draw
    last: int | None = None  # ... and of its last
    per_phase: list[int] = field(default_factory=list)  # samples in each phase
    per_phase_tokens: list[float] | None = None  # estimated tokens in each phase
    per_pass: list[int] = field(default_factory=list)  # samples drawn in each pass

    @property
    def repeats(self) -> float:
        """How many times the run reads the dataset over (0: once or less)."""
        return max(0.0, self.samples / max(1, self.size) - 1)


@dataclass
class PlanReport:
    """What a run of a work source will deliver and fetch (see :func:`plan_report`)."""

    lanes: int
    samples: int
    phases: list[int]  # global start of each phase (the schedule's unit)
    unit: str
    datasets: list[DatasetPlan]
    requests: int
    bytes: int
    get_price_per_1000: float
    egress_price_per_gib: float
    shares: list[list[float]]  # per bucket of the run (in samples), each dataset's share
    finite: bool

    @property
    def cost(self) -> float:
        """Estimated object store cost: GET requests plus bytes out, at the given prices."""
        gets = self.requests / 1000 * self.get_price_per_1000
        return gets + self.bytes / 2**30 * self.egress_price_per_gib

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cost"] = self.cost
        for d, plan in zip(out["datasets"], self.datasets, strict=True):
            d["repeats"] = plan.repeats
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def text(self) -> str:
        """The report as a table for a terminal."""
        span = "the whole run" if self.finite else f"the first {self.samples:,} samples"
        lines = [
            f"plan of {span} over {self.lanes} lane(s): {self.samples:,} samples, "
            f"{self.requests:,} reads, {self.bytes / 2**20:,.1f} MiB, est. ${self.cost:,.4f}",
            "",
            f"{'dataset':<16} {'samples':>12} {'share':>7} {'tokens':>14} {'passes':>6} "
            f"{'repeats':>8} {'first':>12} {'last':>12}",
        ]
        for d in self.datasets:
            tokens = "-" if d.tokens is None else f"{d.tokens:,.0f}"
            share = d.samples / max(1, self.samples)
            first = "-" if d.first is None else f"{d.first:,}"
            last = "-" if d.last is None else f"{d.last:,}"
            lines.append(
                f"{d.name:<16} {d.samples:>12,} {share:>7.1%} {tokens:>14} {d.passes:>6} "
                f"{d.repeats:>8.2f} {first:>12} {last:>12}"
            )
        if len(self.phases) > 1:
            lines += [
                "",
                f"phase  start ({self.unit})  " + "  ".join(d.name for d in self.datasets),
            ]
            for i, start in enumerate(self.phases):
                counts = "  ".join(f"{d.per_phase[i]:,}" for d in self.datasets)
                lines.append(f"{i:<6} {start:>15,}  {counts}")
        return "\n".join(lines)

    def plot(self, path: str) -> str:
        """A PNG of the mixture over the run and of each dataset's passes (needs matplotlib,
        the ``plot`` extra). Returns ``path``."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            raise ConfigError(
                "the plan's plot needs matplotlib: pip install 'zephon[plot]'"
            ) from None
        fig, (mix, reps) = plt.subplots(1, 2, figsize=(12, 4.5), width_ratios=[2, 1])
        shares = np.array(self.shares).T if self.shares else np.zeros((len(self.datasets), 0))
        x = (np.arange(shares.shape[1]) + 0.5) * self.samples / max(1, shares.shape[1])
        mix.stackplot(x, shares, labels=[d.name for d in self.datasets])
        for start in self.phases[1:] if self.unit == "samples" else ():
            mix.axvline(start, color="black", linewidth=0.8, linestyle="--")
        mix.set_xlabel("global position (samples)")
        mix.set_ylabel("share of the mixture")
        mix.set_ylim(0, 1)
        mix.legend(loc="upper right", fontsize="small")
        mix.set_title("mixture over the run")
        names = [d.name for d in self.datasets]
        reps.bar(names, [d.samples / max(1, d.size) for d in self.datasets])
        reps.axhline(1, color="black", linewidth=0.8)
        reps.set_ylabel("times each sample is read (mean)")
        reps.set_title("repetition")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def plan_report(
    ws: StaticMixtureWorkSource,
    lanes: int = 1,
    *,
    samples: int | None = None,
    get_price_per_1000: float = 0.0004,
    egress_price_per_gib: float = 0.0,
    buckets: int = 200,
) -> PlanReport:
    """Plan all ``lanes`` lanes of ``ws`` to the end (or to ``samples`` global positions,
    which an endless curriculum needs) and add up the run. ``get_price_per_1000``: the
    object store's price of 1,000 GET requests (S3 standard: 0.0004 USD);
    ``egress_price_per_gib``: of a GiB out (0 within the cloud region).

    Raises:
        ConfigError: an endless curriculum without ``samples``, or bad arguments.
    """
    if isinstance(lanes, bool) or not isinstance(lanes, int) or lanes < 1:
        raise ConfigError(f"report: lanes must be an int >= 1, got {lanes!r}")
    if samples is not None and (
        isinstance(samples, bool) or not isinstance(samples, int) or samples < 1
    ):
        raise ConfigError(f"report: samples must be an int >= 1 or None, got {samples!r}")
    finite = ws.ends().length is not None
    if not finite and samples is None:
        raise ConfigError(
            "report: this curriculum has no end (repeat, no stop_after_passes, no epoch_size "
            "or budget ending it): say how far to plan with samples=N"
        )
    user = _user_phases(ws)
    ratios = ws.tokens_per_byte
    known = ratios is not None and all(r is not None for r in ratios)
    plans = [
        DatasetPlan(name, m.num_samples) for name, m in zip(ws.names, ws.manifests, strict=True)
    ]
    for entry in plans:
        entry.per_phase = [0] * len(user)
        entry.tokens = 0.0 if known else None
        entry.per_phase_tokens = [0.0] * len(user) if known else None
    reads = [0, 0]  # storage reads and their bytes
    picks_at: list[np.ndarray] = []  # (global position, dataset) of every draw, for the shares
    for lane in range(lanes):
        limit = None if samples is None else max(0, math.ceil((samples - lane) / lanes))
        picks_at += _plan_lane(ws, lane, lanes, limit, user, plans, reads, known)
    for plan in plans:
        plan.passes = sum(1 for c in plan.per_pass if c)
    total = sum(p.shape[1] for p in picks_at)
    return PlanReport(
        lanes,
        total,
        user,
        ws.mixture_unit,
        plans,
        reads[0],
        reads[1],
        get_price_per_1000,
        egress_price_per_gib,
        _shares(picks_at, total, buckets, len(plans)),
        finite and samples is None,
    )


def _plan_lane(
    ws: StaticMixtureWorkSource,
    lane: int,
    lanes: int,
    limit: int | None,
    user: list[int],
    plans: list[DatasetPlan],
    reads: list[int],
    known: bool,
) -> list[np.ndarray]:
    """Plan one lane (up to ``limit`` positions) into ``plans`` and ``reads``; returns the
    global positions and datasets of its draws."""
    groups = ReadGroups(ws.coalesce_gap_bytes, ws.max_request_bytes)
    if ws.mixture_unit == "tokens":
        starts = np.array([b / lanes for b in user])
    else:
        starts = np.array([max(0, math.ceil((b - lane) / lanes)) for b in user])
    spent, out = 0.0, []
    for chunk in ws.chunks(lane, lanes):
        pos = chunk.cursor.position
        n = len(chunk) if limit is None else min(len(chunk), limit - pos)
        if n <= 0:
            break
        tokens = _tokens(ws, chunk, n) if known else np.zeros(n)
        if ws.mixture_unit == "tokens":  # a token schedule's phase: by the lane's tokens
            at = spent + np.concatenate(([0.0], np.cumsum(tokens)[:-1]))
            spent += float(tokens.sum())
        else:
            at = (pos + np.arange(n)).astype(np.float64)
        phase = np.searchsorted(starts, at, side="right") - 1
        positions = (pos + np.arange(n)) * lanes + lane
        for d in np.unique(chunk.datasets[:n]).tolist():
            mask = chunk.datasets[:n] == d
            _add(plans[d], positions[mask], phase[mask], tokens[mask], chunk.passes[:n][mask])
        requests = chunk.requests
        if n < len(chunk):  # the bound cuts the chunk: its reads up to the bound
            requests = cut_requests(requests, 0, n)
        for request in requests:  # the storage reads the fetch stage will make
            _count(groups.add(request), reads)
        out.append(np.stack([positions, chunk.datasets[:n]]))
        if limit is not None and pos + n >= limit:
            break
    _count(groups.finish(), reads)
    return out


def _tokens(ws: StaticMixtureWorkSource, chunk: Any, n: int) -> np.ndarray:
    """Estimated tokens of a chunk's first ``n`` draws (bytes times tokens per byte)."""
    ratios = ws.tokens_per_byte
    assert ratios is not None
    tokens = np.zeros(n)
    ds = chunk.datasets[:n]
    for d in np.unique(ds).tolist():
        mask = ds == d
        nbytes = ws.manifests[d].sample_nbytes(chunk.shards[:n][mask], chunk.samples[:n][mask])
        tokens[mask] = nbytes * ratios[d]
    return tokens


def _add(
    plan: DatasetPlan, where: np.ndarray, phase: np.ndarray, tokens: np.ndarray, passes: np.ndarray
) -> None:
    """One dataset's draws of a chunk into its plan."""
    plan.samples += len(where)
    if plan.tokens is not None:
        plan.tokens += float(tokens.sum())
    low, high = int(where.min()), int(where.max())
    plan.first = low if plan.first is None else min(plan.first, low)
    plan.last = high if plan.last is None else max(plan.last, high)
    for i, c in enumerate(np.bincount(phase, minlength=len(plan.per_phase)).tolist()):
        plan.per_phase[i] += c
    if plan.per_phase_tokens is not None:
        weights = np.bincount(phase, tokens, minlength=len(plan.per_phase_tokens))
        for i, t in enumerate(weights.tolist()):
            plan.per_phase_tokens[i] += t
    per_pass = np.bincount(passes).tolist()
    plan.per_pass += [0] * max(0, len(per_pass) - len(plan.per_pass))
    for p, c in enumerate(per_pass):
        plan.per_pass[p] += c


def _count(groups: list[Any], reads: list[int]) -> None:
    for group in groups:
        count, size = group_reads(group)
        reads[0] += count
        reads[1] += size


def _shares(picks_at: list[np.ndarray], total: int, buckets: int, k: int) -> list[list[float]]:
    """Each dataset's share of the draws in ``buckets`` even stretches of the run."""
    if not picks_at:
        return []
    both = np.concatenate(picks_at, axis=1)
    width = max(1, math.ceil(total / buckets))
    bucket = both[0] // width
    grid = np.zeros((int(bucket.max()) + 1, k))
    np.add.at(grid, (bucket, both[1]), 1)
    return (grid / np.maximum(1, grid.sum(axis=1, keepdims=True))).tolist()  # type: ignore[no-any-return]


def _user_phases(ws: StaticMixtureWorkSource) -> list[int]:
    """The schedule's phases as the user wrote them (a linear ramp's steps folded in)."""
    from zephon.plan.schedule import MixtureSchedule

    if isinstance(ws.mixture, MixtureSchedule):
        return [start for start, _ in ws.mixture.phases]
    return [0]


def read_amplification(
    ws: StaticMixtureWorkSource, lanes: int, chunks: int = 8, cache_bytes: int = 0
) -> float | None:
    """Bytes the first ``chunks`` chunks of every lane fetch over the bytes of their samples:
    each lane's reads grouped as its fetch stage groups them, all of them through one range
    cache of ``cache_bytes`` (the lanes of a pipeline share it), the lanes taking turns. 1.0
    reads nothing more than the data; a global shuffle of small records reads neighbours
    too. ``None`` if it cannot be planned yet (a token mixture before its ratios are
    measured)."""
    groups = [ReadGroups(ws.coalesce_gap_bytes, ws.max_request_bytes) for _ in range(lanes)]
    cache = _CacheModel(cache_bytes)
    data = 0.0
    try:
        plans = [iter(ws.chunks(lane, lanes)) for lane in range(lanes)]
        for _ in range(chunks):
            for lane, plan in enumerate(plans):
                chunk = next(plan, None)
                if chunk is None:
                    continue
                for d in np.unique(chunk.datasets).tolist():
                    mask = chunk.datasets == d
                    manifest = ws.manifests[d]
                    data += float(
                        manifest.sample_nbytes(chunk.shards[mask], chunk.samples[mask]).sum()
                    )
                for request in chunk.requests:
                    for group in groups[lane].add(request):
                        cache.read_group(group)
    except ConfigError:
        return None
    for lane_groups in groups:
        for group in lane_groups.finish():
            cache.read_group(group)
    return cache.fetched / data if data else None


class _CacheModel:
    """The fetch stage's range cache as the estimate sees it: the spans read, per object,
    least recently used out past ``capacity`` bytes; a read fetches only what no kept span
    covers (``capacity`` 0: every read fetches all it spans)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.fetched = 0
        self._spans: OrderedDict[tuple[str, int], int] = OrderedDict()  # (uri, start) -> stop
        self._bytes = 0

    def read_group(self, group: list[Any]) -> None:
        if len(group) == 1:
            for start, stop in group[0].ranges:
                self._read(group[0].uri, start, stop)
        else:
            self._read(group[0].uri, group[0].ranges[0][0], max(r.ranges[0][1] for r in group))

    def _read(self, uri: str, start: int, stop: int) -> None:
        if self.capacity <= 0:
            self.fetched += stop - start
            return
        covered = [
            (max(a, start), min(b, stop))
            for (u, a), b in self._spans.items()
            if u == uri and a < stop and b > start
        ]
        kept, at = 0, start
        for a, b in sorted(covered):
            a = max(a, at)
            if b > a:
                kept += b - a
                at = b
        self.fetched += stop - start - kept
        key = (uri, start)
        self._bytes -= self._spans.pop(key, start) - start
        self._spans[key] = stop
        self._bytes += stop - start
        while self._bytes > self.capacity and self._spans:
            (_, a), b = self._spans.popitem(last=False)
            self._bytes -= b - a

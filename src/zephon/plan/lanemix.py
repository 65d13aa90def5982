"""One lane's mixture over its positions: a schedule's phases, cut into segments.

The schedule's phases start at global positions; a lane's share of global positions is every
``lanes``-th one (lane ``l`` holds global positions ``g`` with ``g % lanes == l``, counted
from the start of the lane's generation), so phase ``i`` starts in lane ``l`` at its position
``ceil((start_i - origin - l) / lanes)``: summed over the lanes, exactly ``start_i`` draws
come before it, whatever the number of lanes. Token schedules start a lane's phase once the
lane has drawn ``(start_i - origin) / lanes`` tokens.

A *segment* is a stretch of a lane with one set of weights: a phase, over the datasets it
draws that the lane has not used up (a dataset whose share of the curriculum the lane has
drawn, or that reached its budget, leaves; the others renormalise, proportionally). Each
segment mixes by the exact greedy of :mod:`zephon.plan.mixture` counted from its own start
(``base``, which a cursor carries), so within every segment every prefix keeps each
dataset within the static mixture's bound of its share. A phase in which nothing is left to
draw gives way to the next one at once. What rounding leaves of a lane's share of a dataset
that no later phase draws is drawn last, in a segment of its own: every lane draws exactly
its share of every dataset, so all lanes together draw exactly the plan's end counts.

A work source without a schedule or budgets (``renormalize=False``) keeps the original rule:
one segment, and a dataset whose share is drawn drops out of the greedy while the others go on
by the same weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from zephon.plan.mixture import SampleSchedule
from zephon.plan.schedule import Phase

__all__ = ["LaneMix"]

Segment = tuple[int, tuple[int, ...]]  # (phase, datasets live in it); phase -1: nothing left
LEFTOVER = -2  # the segment of a lane's last draws that no phase draws any more


class LaneMix:
    """The phases of a schedule at one lane's positions, and the picks of its segments.

    Args:
        phases: the bound schedule (global starts).
        unit: ``"samples"`` or ``"tokens"``.
        lane, lanes: the lane and how many share the generation.
        origin: the generation's start, a global position in ``unit``.
        quotas: per dataset, the lane's draws of it over the curriculum (``None``: no end).
        renormalize: segments as in the module doc (else the original single-segment rule).
    """

    def __init__(
        self,
        phases: Sequence[Phase],
        unit: str,
        lane: int,
        lanes: int,
        origin: float,
        quotas: Sequence[int | None] | None,
        renormalize: bool,
    ) -> None:
        self.weights = [p.weights for p in phases]
        self.unit = unit
        if unit == "samples":
            self.starts: list[float] = [
                max(0, math.ceil((p.start - origin - lane) / lanes)) for p in phases
            ]
        else:
            self.starts = [max(0.0, (p.start - origin) / lanes) for p in phases]
        self.quotas = list(quotas) if quotas is not None else None
        self.renormalize = renormalize
        self._schedules: dict[tuple[Fraction, ...], SampleSchedule] = {}

    @property
    def k(self) -> int:
        return len(self.weights[0])

    def phase_at(self, position: float) -> int:
        i = 0
        while i + 1 < len(self.starts) and self.starts[i + 1] <= position:
            i += 1
        return i

    def _room(self, counts: Sequence[int], d: int) -> bool:
        q = None if self.quotas is None else self.quotas[d]
        return q is None or counts[d] < q

    def segment(self, counts: Sequence[int], position: float) -> Segment:
        """The segment in effect at ``position`` with ``counts`` drawn."""
        if not self.renormalize:
            return 0, ()
        for i in range(self.phase_at(position), len(self.weights)):
            live = tuple(
                d for d in range(self.k) if self.weights[i][d] > 0 and self._room(counts, d)
            )
            if live:
                return i, live
        if self.quotas is not None:  # what rounding left of datasets no phase draws any more
            rest = tuple(d for d, q in enumerate(self.quotas) if q is not None and counts[d] < q)
            if rest:
                return LEFTOVER, rest
        return -1, ()

    def segment_weights(self, segment: Segment) -> tuple[Fraction, ...]:
        """The weights of a segment: its phase's, over its live datasets, renormalised."""
        i, live = segment
        if not self.renormalize:
            return self.weights[0]
        if i == LEFTOVER:
            return tuple(
                Fraction(1, len(live)) if d in live else Fraction(0) for d in range(self.k)
            )
        total = sum(self.weights[i][d] for d in live)
        return tuple(
            self.weights[i][d] / total if d in live else Fraction(0) for d in range(self.k)
        )

    def _schedule(self, weights: tuple[Fraction, ...]) -> SampleSchedule:
        found = self._schedules.get(weights)
        if found is None:
            found = self._schedules[weights] = SampleSchedule(weights)
        return found

    def start_base(
        self, counts: Sequence[int], position: float, base: Sequence[int] | None, at: float
    ) -> bool:
        """Whether ``base`` (draws at position ``at``) still starts the segment in effect at
        ``counts``/``position`` (else a segment starts here)."""
        if not self.renormalize:
            return True
        zero = [0] * self.k
        return self.segment(base or zero, at) == self.segment(counts, position)

    def sample_picks(
        self, counts: Sequence[int], base: Sequence[int] | None, n: int
    ) -> tuple[np.ndarray, list[tuple[int, tuple[int, ...] | None]]]:
        """The datasets of the lane's next ``n`` positions (fewer at its end) after
        ``counts``, in the segment that started at ``base`` (``None``: zeros). Returns them
        and the segments they are in: ``(offset, base)``, the first at offset 0."""
        counts = [int(c) for c in counts]
        t = sum(counts)
        if base is None or not self.start_base(counts, t, base, sum(base)):
            base = list(counts) if self.renormalize and any(counts) else None
        base_ = list(base) if base is not None else [0] * self.k
        segment = self.segment(counts, t)
        if not self.renormalize:
            got = self._schedule(self.weights[0]).picks(counts, n, self.quotas)
            return got, [(0, None)]
        parts: list[np.ndarray] = []
        marks: list[tuple[int, tuple[int, ...] | None]] = [
            (0, tuple(base) if base is not None else None)
        ]
        done = 0
        while done < n and segment[0] != -1:
            i, live = segment
            end = self.starts[i + 1] - t if 0 <= i < len(self.starts) - 1 else n
            want = int(min(n - done, end))
            rel = [c - b for c, b in zip(counts, base_, strict=True)]
            caps: list[int | None] = [None] * self.k
            if self.quotas is not None:
                caps = [
                    None if q is None else q - b for q, b in zip(self.quotas, base_, strict=True)
                ]
            got = self._schedule(self.segment_weights(segment)).picks(rel, want, caps)
            cut = len(got)
            for d in live:  # the first dataset to use up its share ends the segment
                q = None if self.quotas is None else self.quotas[d]
                if q is not None:
                    where = np.flatnonzero(got == d)
                    room = q - counts[d]
                    if len(where) >= room:
                        cut = min(cut, int(where[room - 1]) + 1)
            got = got[:cut]
            if not len(got):
                break
            parts.append(got)
            for d, c in enumerate(np.bincount(got, minlength=self.k).tolist()):
                counts[d] += c
            t += len(got)
            done += len(got)
            after = self.segment(counts, t)
            if after != segment:
                base_ = list(counts)
                marks.append((done, tuple(base_)))
                segment = after
        out = np.concatenate(parts) if parts else np.zeros(0, np.int64)
        return out.astype(np.int64, copy=False), marks

    def token_picks(
        self,
        counts: Sequence[int],
        tokens: Sequence[float],
        base: tuple[Sequence[int], Sequence[float]] | None,
        upcoming: Sequence[np.ndarray],
        n: int,
    ) -> tuple[np.ndarray, list[float], tuple[tuple[int, ...], tuple[float, ...]] | None]:
        """A token mixture's next ``n`` positions (fewer at the lane's end): each goes to the
        live dataset furthest behind its token share of the segment. ``upcoming[d]`` holds
        the token estimates of ``d``'s next samples (as many as it may still draw, up to
        ``n``). Returns the picks, the token totals after them and the base of the segment
        the lane is in after them (``None``: the lane's start)."""
        counts, totals = [int(c) for c in counts], [float(t) for t in tokens]
        zero = ([0] * self.k, [0.0] * self.k)
        b_counts, b_tokens = (list(base[0]), list(base[1])) if base is not None else zero
        if self.renormalize and not self.start_base(counts, sum(totals), b_counts, sum(b_tokens)):
            b_counts, b_tokens = list(counts), list(totals)
        segment = self.segment(counts, sum(totals))
        taken = [0] * self.k
        out: list[int] = []
        while len(out) < n:
            if self.renormalize:
                if segment[0] == -1:
                    break
                live = list(segment[1])
                w = [float(x) for x in self.segment_weights(segment)]
            else:
                live = [d for d in range(self.k) if self._room(counts, d)]
                if not live:
                    break
                w = [float(x) for x in self.weights[0]]
            rel = [t - b for t, b in zip(totals, b_tokens, strict=True)]
            grand = sum(rel)
            best, best_v = live[0], w[live[0]] * grand - rel[live[0]]
            for d in live[1:]:
                v = w[d] * grand - rel[d]
                if v > best_v:
                    best, best_v = d, v
            totals[best] += float(upcoming[best][taken[best]])
            taken[best] += 1
            counts[best] += 1
            out.append(best)
            if self.renormalize:
                after = self.segment(counts, sum(totals))
                if after != segment:
                    b_counts, b_tokens, segment = list(counts), list(totals), after
        last = None if not any(b_counts) else (tuple(b_counts), tuple(b_tokens))
        return np.array(out, dtype=np.int64), totals, last

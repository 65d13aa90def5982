"""How much of each dataset a scheduled or budgeted curriculum draws: its end counts.

The curriculum is followed as a fluid, exactly (rational arithmetic): over global positions
the datasets are drawn at their phase's weights, renormalised over the datasets still in the
mixture. Events change the rates or end the run:

- a phase starts (a schedule's boundary, in samples or in tokens);
- a dataset reaches a cap (``max_samples``, ``max_tokens`` as samples, or its passes under
  ``exhausted_policy="drop"``): it leaves the mixture, the others renormalise;
- a ``stop`` dataset completes its passes, or a ``max_repeats`` dataset would start another:
  the curriculum ends;
- every dataset has completed ``stop_after_passes`` passes (a dataset that left, or that no
  later phase draws, counts as complete): the curriculum ends (not with an epoch size);
- ``epoch_size`` samples have been drawn: the curriculum ends;
- no dataset of the current phase is left: the curriculum ends.

The end counts are the fluid's draws at the end, made integers that sum to the run's length
(largest remainders); a dataset that left has drawn exactly its cap. Lanes then deal each
dataset's count fairly (:class:`~zephon.plan.lanes.LaneSplit`), and a dataset that leaves
before the end leaves each lane when the lane's share is drawn (``departs``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from zephon.plan.mixture import rational_weights
from zephon.plan.schedule import Phase

__all__ = ["Ends", "curriculum_ends", "fluid_ends"]

_MAX_EVENTS = 1_000_000


@dataclass(frozen=True)
class Ends:
    """Per dataset, its draws over the whole curriculum (``None``: unbounded) and whether it
    leaves the mixture at that count before the curriculum ends."""

    counts: list[int | None]
    departs: list[bool]
    length: int | None  # samples of the whole curriculum (None: infinite)


def fluid_ends(
    phases: Sequence[Phase],
    unit: str,
    sizes: Sequence[int],
    policies: Sequence[str],
    max_repeats: Sequence[int | None],
    passes: int | None,
    caps: Sequence[int | None],
    epoch_size: int | None,
    tokens_per_sample: Sequence[float] | None = None,
) -> Ends:
    """The end counts of a curriculum (see the module doc). Long because the fluid is one
    event loop: each pass takes the phase and the datasets still drawn, finds the next
    event among all the kinds the module doc lists, advances to it and applies it; split up,
    its state (draws, position, datasets that left) would travel through every piece."""
    k = len(sizes)
    tps = [Fraction(t).limit_denominator(1 << 20) for t in (tokens_per_sample or [1.0] * k)]
    leave: list[int | None] = list(caps)
    end_at: list[int | None] = [None] * k
    for d in range(k):
        if policies[d] == "stop":
            end_at[d] = (passes or 1) * sizes[d]
        elif policies[d] == "drop":
            own = (passes or 1) * sizes[d]
            leave[d] = own if leave[d] is None else min(own, leave[d])  # type: ignore[type-var]
        elif max_repeats[d] is not None:
            end_at[d] = (1 + max_repeats[d]) * sizes[d]  # type: ignore[operator]
        if leave[d] is not None and end_at[d] is not None and leave[d] < end_at[d]:  # type: ignore[operator]
            end_at[d] = None  # it leaves before it could end the run
    complete = passes if epoch_size is None else None  # an epoch ends the run, not passes
    drawn = [Fraction(0)] * k
    left = [False] * k
    t, tokens = Fraction(0), Fraction(0)
    ended = False
    for _ in range(_MAX_EVENTS):
        i = _phase_at(phases, t if unit == "samples" else tokens)
        weights = phases[i].weights
        live = [d for d in range(k) if not left[d] and weights[d] > 0]
        if not live:
            ended = True
            break
        share = [weights[d] / tps[d] if unit == "tokens" else weights[d] for d in range(k)]
        total = sum(share[d] for d in live)
        rate = [share[d] / total if d in live else Fraction(0) for d in range(k)]
        token_rate = sum(rate[d] * tps[d] for d in live)
        steps: list[Fraction] = []
        if i + 1 < len(phases):
            gap = phases[i + 1].start - (t if unit == "samples" else tokens)
            steps.append(gap if unit == "samples" else gap / token_rate)
        for d in live:
            for limit in (leave[d], end_at[d]):
                if limit is not None:
                    steps.append((limit - drawn[d]) / rate[d])
            if complete is not None and drawn[d] < complete * sizes[d]:
                steps.append((complete * sizes[d] - drawn[d]) / rate[d])
        if epoch_size is not None:
            steps.append(epoch_size - t)
        if not steps:
            break  # nothing ever ends the run
        step = max(Fraction(0), min(steps))
        for d in live:
            drawn[d] += rate[d] * step
        t += step
        tokens += token_rate * step
        if epoch_size is not None and t >= epoch_size:
            ended = True
            break
        if any(end_at[d] is not None and drawn[d] >= end_at[d] for d in live):  # type: ignore[operator]
            ended = True
            break
        for d in live:
            if leave[d] is not None and drawn[d] >= leave[d]:  # type: ignore[operator]
                left[d] = True
        now = _phase_at(phases, t if unit == "samples" else tokens)
        if complete is not None and all(
            left[d] or drawn[d] >= complete * sizes[d] or _absent_from(phases, now, d)
            for d in range(k)
        ):
            ended = True
            break
    else:
        raise RuntimeError("the curriculum's end was not found (too many events)")
    if not ended:
        counts: list[int | None] = [
            int(drawn[d]) if left[d] else None for d in range(k)
        ]  # unbounded but for the datasets that left
        return Ends(counts, [left[d] for d in range(k)], None)
    fixed = [left[d] or _reached(drawn[d], end_at[d]) for d in range(k)]
    out = _apportion(drawn, fixed, round(t))
    return Ends(list(out), [left[d] for d in range(k)], sum(out))


def _reached(drawn: Fraction, limit: int | None) -> bool:
    return limit is not None and drawn >= limit


def _phase_at(phases: Sequence[Phase], position: Fraction) -> int:
    i = 0
    while i + 1 < len(phases) and phases[i + 1].start <= position:
        i += 1
    return i


def _absent_from(phases: Sequence[Phase], i: int, d: int) -> bool:
    """Dataset ``d`` has weight 0 in phase ``i`` and every later one."""
    return all(p.weights[d] == 0 for p in phases[i:])


def _apportion(drawn: Sequence[Fraction], fixed: Sequence[bool], length: int) -> list[int]:
    """Integers close to ``drawn``: exact where ``fixed`` (already integers), the others by
    largest remainders so that they sum to ``length`` (as far as they can)."""
    out = [math.floor(x) for x in drawn]
    free = [d for d in range(len(drawn)) if not fixed[d]]
    rest = length - sum(out)
    order = sorted(free, key=lambda d: (-(drawn[d] - out[d]), d))
    for d in order[: max(0, rest)]:
        out[d] += 1
    return out


def curriculum_ends(ws: Any) -> Ends:
    """The end counts of work source ``ws``: for a static mixture without budgets, the
    original rule (:meth:`zephon.plan.exhaustion.Exhaustion.end_counts`, unchanged so that
    its checkpoints plan as before); otherwise the fluid (:func:`fluid_ends`), with
    ``max_tokens`` converted to draws at each dataset's mean tokens per sample."""
    sizes = [m.num_samples for m in ws.manifests]
    k = len(sizes)
    if not ws.renormalize:
        weights = ws.weights
        if ws.mixture_unit == "tokens":  # token shares -> expected sample shares
            per_sample = ws.tokens_per_sample()
            weights = rational_weights(
                [w / max(t, 1e-12) for w, t in zip(weights, per_sample, strict=True)]
            )
        legacy = ws.exhaustion.end_counts(weights, sizes)
        counts: list[int | None] = list(legacy) if legacy is not None else [None] * k
        return Ends(counts, [False] * k, None if legacy is None else sum(legacy))
    need_tokens = ws.mixture_unit == "tokens" or ws.max_tokens is not None
    tps = ws.tokens_per_sample() if need_tokens else None
    caps: list[int | None] = list(ws.max_samples or [None] * k)
    for d, cap in enumerate(ws.max_tokens or []):
        if cap is not None:
            assert tps is not None
            as_samples = math.ceil(cap / max(tps[d], 1e-12))
            caps[d] = as_samples if caps[d] is None else min(caps[d], as_samples)
    return fluid_ends(
        ws.phases,
        ws.mixture_unit,
        sizes,
        ws.exhaustion.policies,
        ws.exhaustion.max_repeats,
        ws.exhaustion.passes,
        caps,
        ws.epoch_size,
        tps if ws.mixture_unit == "tokens" else None,
    )

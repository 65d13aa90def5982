"""Mixture schedules: weights that change over the run, at global positions.

A :class:`MixtureSchedule` lists phases ``(position, {dataset: weight})``: from ``position``
on (global: samples, or tokens, of all lanes together) the mixture draws by those weights,
until the next phase. A dataset left out of a phase has weight 0 there, so datasets enter and
leave at phase boundaries. With ``interpolate="linear"`` the weights move from one phase's to
the next's in 64 even steps (each step's weights are the ramp's mean over it, on a grid of
1/1024), and stay at the last phase's.

Bound to a work source's datasets (:meth:`MixtureSchedule.bind`), a schedule becomes a list
of :class:`Phase`: a start and exact weights per dataset. A static mixture is one phase at 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Literal

from zephon.choices import MixtureUnit, check
from zephon.errors import ConfigError
from zephon.plan.mixture import rational_weights

__all__ = ["Interpolate", "MixtureSchedule", "Phase", "first_difference", "phases_of"]

Interpolate = Literal["step", "linear"]
RAMP_STEPS = 64  # steps of a linear ramp between two phases
GRID = 1024  # a ramp step's weights are multiples of 1 / GRID


@dataclass(frozen=True)
class Phase:
    """From ``start`` on (global position in the schedule's unit), draw by ``weights`` (one
    per dataset, exact, summing to 1; zero for a dataset out of the phase)."""

    start: int
    weights: tuple[Fraction, ...]

    def describe(self) -> list[Any]:
        return [self.start, [str(w) for w in self.weights]]


class MixtureSchedule:
    """Mixture weights over the run: ``[(position, {name: weight}), ...]``.

    Args:
        phases: the first at position 0, positions increasing; weights relative (normalised
            per phase), non-negative, at least one positive per phase.
        unit: ``"samples"`` or ``"tokens"``: what positions count and what weights share
            (a token schedule makes the mixture a token mixture).
        interpolate: ``"step"`` (each phase's weights hold until the next) or ``"linear"``
            (weights ramp from one phase's to the next's).

    Raises:
        ConfigError: phases empty, not starting at 0 or not increasing, a weight negative or
            not a number, a phase with no positive weight.

    Example::

        MixtureSchedule(
            [
                (0, {"web": 0.7, "code": 0.3}),
                (2_000_000_000, {"web": 0.5, "code": 0.3, "math": 0.2}),
            ],
            unit="tokens",
        )
    """

    def __init__(
        self,
        phases: Sequence[tuple[int, Mapping[str, float]]],
        *,
        unit: MixtureUnit = "samples",
        interpolate: Interpolate = "step",
    ) -> None:
        check("MixtureSchedule unit", unit, MixtureUnit)
        check("MixtureSchedule interpolate", interpolate, Interpolate)
        if isinstance(phases, Mapping) or not isinstance(phases, Sequence) or not phases:
            raise ConfigError(
                "MixtureSchedule phases must be a non-empty list of (position, {name: weight}), "
                f"got {phases!r:.80}"
            )
        checked: list[tuple[int, dict[str, float]]] = []
        for i, phase in enumerate(phases):
            if not isinstance(phase, Sequence) or len(phase) != 2:
                raise ConfigError(f"MixtureSchedule phase {i}: not a (position, weights) pair")
            position, weights = phase
            if isinstance(position, bool) or not isinstance(position, int) or position < 0:
                raise ConfigError(
                    f"MixtureSchedule phase {i}: position must be an int >= 0, got {position!r}"
                )
            if i == 0 and position != 0:
                raise ConfigError(f"MixtureSchedule phase 0 must start at 0, not {position}")
            if i and position <= checked[-1][0]:
                raise ConfigError(
                    f"MixtureSchedule phase {i}: positions must increase, {position} follows "
                    f"{checked[-1][0]}"
                )
            if not isinstance(weights, Mapping) or not weights:
                raise ConfigError(f"MixtureSchedule phase {i}: weights must be {{name: weight}}")
            for name, w in weights.items():
                ok = isinstance(w, int | float | Fraction) and not isinstance(w, bool)
                if not ok or not math.isfinite(w) or w < 0:
                    raise ConfigError(
                        f"MixtureSchedule phase {i}: weight of {name!r} must be a number >= 0, "
                        f"got {w!r}"
                    )
            if not any(w > 0 for w in weights.values()):
                raise ConfigError(f"MixtureSchedule phase {i}: every weight is 0")
            checked.append((position, dict(weights)))
        self.phases = checked
        self.unit: MixtureUnit = unit
        self.interpolate: Interpolate = interpolate

    def __repr__(self) -> str:
        return (
            f"MixtureSchedule({self.phases!r}, unit={self.unit!r}, "
            f"interpolate={self.interpolate!r})"
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MixtureSchedule) and (
            self.phases,
            self.unit,
            self.interpolate,
        ) == (other.phases, other.unit, other.interpolate)

    __hash__ = None  # type: ignore[assignment]

    def bind(self, names: Sequence[str]) -> list[Phase]:
        """The phases over the datasets ``names`` (a linear ramp as its steps).

        A dataset no phase names is not drawn (a phase added on restore may bring it in).

        Raises:
            ConfigError: a phase names an unknown dataset.
        """
        known = set(names)
        for i, (_, weights) in enumerate(self.phases):
            unknown = sorted(set(weights) - known)
            if unknown:
                raise ConfigError(
                    f"MixtureSchedule phase {i} names unknown datasets {unknown} (datasets: "
                    f"{list(names)})"
                )
        phases = [
            Phase(start, _normalised([w.get(n, 0) for n in names])) for start, w in self.phases
        ]
        if self.interpolate == "step" or len(phases) == 1:
            return phases
        out: list[Phase] = []
        for a, b in itertools.pairwise(phases):
            out += _ramp(a, b)
        return [*out, phases[-1]]


def _normalised(weights: Sequence[float | int | Fraction]) -> tuple[Fraction, ...]:
    positive = [w for w in weights if w > 0]
    exact = iter(rational_weights(positive))
    return tuple(next(exact) if w > 0 else Fraction(0) for w in weights)


def _ramp(a: Phase, b: Phase) -> list[Phase]:
    """The steps from phase ``a``'s weights to ``b``'s, over ``[a.start, b.start)``."""
    span = b.start - a.start
    steps = min(RAMP_STEPS, span)
    out = []
    for j in range(steps):
        lo, hi = a.start + span * j // steps, a.start + span * (j + 1) // steps
        mid = Fraction(lo + hi, 2) - a.start
        f = mid / span
        exact = [wa + (wb - wa) * f for wa, wb in zip(a.weights, b.weights, strict=True)]
        out.append(Phase(lo, _on_grid(exact)))
    return out


def _on_grid(weights: Sequence[Fraction]) -> tuple[Fraction, ...]:
    """Weights summing to 1 as multiples of ``1/GRID`` (largest remainders; a positive weight
    keeps at least one unit where it can)."""
    scaled = [w * GRID for w in weights]
    units = [math.floor(s) for s in scaled]
    rest = GRID - sum(units)
    order = sorted(range(len(scaled)), key=lambda d: (-(scaled[d] - units[d]), d))
    for d in order[:rest]:
        units[d] += 1
    return tuple(Fraction(u, GRID) for u in units)


def first_difference(ours: Sequence[Phase], theirs: Sequence[Phase]) -> int | None:
    """The first global position at which two phase lists draw differently (``None``: they
    never do)."""
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            return min(a.start, b.start)
    if len(ours) != len(theirs):
        return (ours if len(ours) > len(theirs) else theirs)[min(len(ours), len(theirs))].start
    return None


def phases_of(described: Any) -> list[Phase] | None:
    """Phases from a work source description's ``schedule`` (``None``: not phases as a work
    source writes them: starts increasing from 0, weights non-negative fractions summing
    to 1)."""
    try:
        phases = []
        for start, weights in described:
            if isinstance(start, bool) or not isinstance(start, int):
                return None
            exact = tuple(_fraction(w) for w in weights)
            if any(w < 0 for w in exact) or sum(exact, Fraction(0)) != 1:
                return None
            phases.append(Phase(start, exact))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    starts = [p.start for p in phases]
    if not phases or starts[0] != 0 or any(b <= a for a, b in itertools.pairwise(starts)):
        return None
    return phases


def _fraction(value: Any) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, str | int):
        raise TypeError(value)  # a description writes weights as strings
    return Fraction(value)

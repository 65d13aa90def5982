"""Exact, RNG-free interleaving of datasets by weight.

At each position the next sample goes to the dataset furthest behind its share: the ``d``
maximising ``(t + 1) * w_d - c_d`` (``t`` samples placed so far, ``c_d`` of them from ``d``;
ties to the lowest index). Weights are exact rationals, so the comparison is integer
arithmetic, identical on every machine. This greedy keeps every prefix within about one
sample of ``t * w_d`` for every dataset (the property tests check the contract's bound of 2).

Token mixtures use the same greedy on estimated tokens, in :mod:`zephon.plan.lanemix`.

The sequence depends only on ``t``: when the weights' common denominator ``Q`` is small and
the greedy returns to zero deficit after ``Q`` steps, one period is tabulated and a chunk is a
numpy gather; otherwise it is computed step by step from the counts a cursor carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import lcm

import numpy as np

__all__ = ["SampleSchedule", "rational_weights"]

_MAX_TABLE = 1 << 16
_MAX_DENOMINATOR = 1_000_000


def rational_weights(weights: Sequence[float | int | Fraction]) -> list[Fraction]:
    """Normalised exact weights. Floats are taken as the nearest fraction with denominator at
    most 10**6 (0.7 -> 7/10), integers and fractions exactly."""
    fracs = [
        w
        if isinstance(w, Fraction)
        else Fraction(w)
        if isinstance(w, int)
        else Fraction(w).limit_denominator(_MAX_DENOMINATOR)
        for w in weights
    ]
    total = sum(fracs, Fraction(0))
    return [f / total for f in fracs]


class SampleSchedule:
    """Which dataset fills each position of a lane's stream (mixture by samples)."""

    def __init__(self, weights: Sequence[Fraction]) -> None:
        denominator = lcm(*(w.denominator for w in weights))
        self.q = [int(w * denominator) for w in weights]
        self.Q = sum(self.q)
        self._table: np.ndarray | None = None
        if self.Q <= _MAX_TABLE:
            counts = [0] * len(self.q)
            period = self._greedy(0, counts, self.Q)
            if counts == self.q:
                self._table = np.array(period, dtype=np.int64)

    def _greedy(
        self, t: int, counts: list[int], n: int, caps: Sequence[int | None] | None = None
    ) -> list[int]:
        q, big_q, k = self.q, self.Q, len(self.q)
        limit = [-1] * k if caps is None else [-1 if c is None else c for c in caps]
        live = [d for d in range(k) if limit[d] < 0 or counts[d] < limit[d]]
        out = []
        for _ in range(n):
            if not live:
                break
            t += 1
            best, best_v = live[0], t * q[live[0]] - counts[live[0]] * big_q
            for d in live[1:]:
                v = t * q[d] - counts[d] * big_q
                if v > best_v:
                    best, best_v = d, v
            counts[best] += 1
            out.append(best)
            if counts[best] == limit[best]:
                live.remove(best)
        return out

    def _on_table(self, t: int, counts: Sequence[int], caps: Sequence[int | None]) -> bool:
        """Whether ``counts`` are the uncapped schedule's after ``t`` picks: always while no
        dataset has reached its cap; once one has, the capped schedule may have left it."""
        if all(c is None or n < c for n, c in zip(counts, caps, strict=True)):
            return True
        assert self._table is not None
        head = np.bincount(self._table[: t % self.Q], minlength=len(self.q))
        return bool(((t // self.Q) * np.array(self.q) + head == np.array(counts)).all())

    def picks(
        self, counts: Sequence[int], n: int, caps: Sequence[int | None] | None = None
    ) -> np.ndarray:
        """Dataset of each of the next ``n`` positions, after ``counts`` have been drawn.

        With ``caps``, a dataset that has drawn its cap drops out and the others go on by the
        same rule; fewer than ``n`` positions come back once every capped dataset is done
        (datasets with a cap of ``None`` never are).
        """
        t = sum(counts)
        if self._table is None or (caps is not None and not self._on_table(t, counts, caps)):
            return np.array(self._greedy(t, list(counts), n, caps), dtype=np.int64)
        out = self._table[(t + np.arange(n)) % self.Q]
        if caps is None:
            return out
        cut = n  # the first position at which a dataset would pass its cap
        for d, cap in enumerate(caps):
            if cap is not None:
                where = np.flatnonzero(out == d)
                room = cap - counts[d]
                if len(where) > room:
                    cut = min(cut, int(where[max(room, 0)]))
        if cut == n:
            return out
        head = out[:cut]
        after = [int(c) for c in np.asarray(counts) + np.bincount(head, minlength=len(self.q))]
        tail = self._greedy(t + cut, after, n - cut, caps)
        return np.concatenate((head, np.array(tail, dtype=np.int64)))

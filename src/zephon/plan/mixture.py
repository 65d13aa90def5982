"""Exact, RNG-free interleaving of datasets by weight.

At each position the next sample goes to the dataset furthest behind its share: the ``d``
maximising ``(t + 1) * w_d - c_d`` (``t`` samples placed so far, ``c_d`` of them from ``d``;
ties to the lowest index). Weights are exact rationals, so the comparison is integer
arithmetic, identical on every machine. This greedy keeps every prefix within about one
sample of ``t * w_d`` for every dataset (the property tests check the contract's bound of 2).

The sequence depends only on ``t``: when the weights' common denominator ``Q`` is small and
the greedy returns to zero deficit after ``Q`` steps, one period is tabulated and a chunk is a
numpy gather; otherwise it is computed step by step from the counts a cursor carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import lcm

import numpy as np

__all__ = ["SampleSchedule", "TokenSchedule", "rational_weights"]

_MAX_TABLE = 1 << 16
_MAX_DENOMINATOR = 1_000_000


def rational_weights(weights: Sequence[float | int | Fraction]) -> list[Fraction]:
    """Normalised exact weights. Floats are taken as the nearest fraction with denominator at
    most 10**6 (0.7 -> 7/10), integers and fractions exactly."""
    fracs = [
        w if isinstance(w, Fraction) else
        Fraction(w) if isinstance(w, int) else
        Fraction(w).limit_denominator(_MAX_DENOMINATOR)
        for w in weights
    ]  # fmt: skip
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

    def _greedy(self, t: int, counts: list[int], n: int) -> list[int]:
        q, big_q, k = self.q, self.Q, len(self.q)
        out = []
        for _ in range(n):
            t += 1
            best, best_v = 0, t * q[0] - counts[0] * big_q
            for d in range(1, k):
                v = t * q[d] - counts[d] * big_q
                if v > best_v:
                    best, best_v = d, v
            counts[best] += 1
            out.append(best)
        return out

    def picks(self, counts: Sequence[int], n: int) -> np.ndarray:
        """Dataset of each of the next ``n`` positions, after ``counts`` have been drawn."""
        t = sum(counts)
        if self._table is not None:
            return self._table[(t + np.arange(n)) % self.Q]
        return np.array(self._greedy(t, list(counts), n), dtype=np.int64)


class TokenSchedule:
    """Mixture by tokens: the next sample goes to the dataset furthest behind its token share.

    Tokens of a sample are estimated as its byte length times its dataset's tokens-per-byte,
    so the choice depends on which samples come next; the caller supplies their estimates.
    """

    def __init__(self, weights: Sequence[Fraction]) -> None:
        self.w = [float(w) for w in weights]

    def picks(
        self, tokens: Sequence[float], upcoming: Sequence[np.ndarray], n: int
    ) -> tuple[np.ndarray, list[float]]:
        """Datasets of the next ``n`` positions and the token totals after them.

        ``upcoming[d]`` holds the token estimates of dataset ``d``'s next samples (at least
        ``n`` of them).
        """
        totals = list(tokens)
        taken = [0] * len(self.w)
        out = np.empty(n, dtype=np.int64)
        w, k = self.w, len(self.w)
        for i in range(n):
            grand = sum(totals)
            best, best_v = 0, w[0] * grand - totals[0]
            for d in range(1, k):
                v = w[d] * grand - totals[d]
                if v > best_v:
                    best, best_v = d, v
            totals[best] += float(upcoming[best][taken[best]])
            taken[best] += 1
            out[i] = best
        return out, totals

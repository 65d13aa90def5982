"""How one dataset's draws are dealt out to lanes, fairly: within one sample of an even share.

A dataset's curriculum is its multi-pass order (pass 0's ranks, then pass 1's, ...), finite
(``total`` draws, the last pass possibly partial) or infinite. Each pass of length ``m`` is
dealt as follows, with ``C`` ranks per chunk and ``L`` lanes:

- whole rounds first: the first ``(m // (C * L)) * C * L`` ranks are cut into chunks of ``C``
  consecutive ranks, chunk ``j`` to lane ``j % L`` (reads stay dense);
- the remainder ``R`` is cut into ``L`` contiguous pieces, one per lane in lane order, of
  ``R // L`` ranks, ``R % L`` of them one rank longer. The longer pieces go to a cyclic run of
  lanes that starts where the previous pass's (or, for the first pass, the previous
  dataset's) ended: a staircase, so that over any number of passes every lane's share stays
  within one sample of ``draws / L``, and a lane's total over all datasets within one sample
  of every other lane's.

Every lane's share of every pass is known in O(1), so lanes never coordinate, are disjoint
within a pass and together complete it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

__all__ = ["LaneSplit"]


@dataclass(frozen=True)
class _Pass:
    """How one pass of ``m`` ranks is dealt: ``base`` whole rounds of chunks, then pieces of
    ``q`` ranks, ``r`` lanes from lane ``start`` (cyclic) getting one more."""

    m: int
    base: int
    q: int
    r: int

    @classmethod
    def of(cls, m: int, chunk: int, lanes: int) -> _Pass:
        base = m // (chunk * lanes)
        rest = m - base * chunk * lanes
        return cls(m, base, rest // lanes, rest % lanes)


def _extras_before(lane: int, start: np.ndarray, r: np.ndarray, lanes: int) -> np.ndarray:
    """Lanes below ``lane`` inside the cyclic run ``[start, start + r)`` of ``lanes``."""
    first = np.maximum(0, np.minimum(lane, start + r) - start)
    wrapped = np.maximum(0, np.minimum(lane, start + r - lanes))
    return np.asarray(first + wrapped)


@dataclass(frozen=True)
class LaneSplit:
    """The lane split of one dataset of ``n`` samples per pass.

    Attributes:
        n: samples per pass.
        lanes: number of lanes.
        chunk: ranks per chunk of the whole rounds.
        offset: lane where pass 0's longer pieces start.
        total: draws of the whole curriculum (``None``: infinite).
    """

    n: int
    lanes: int
    chunk: int
    offset: int = 0
    total: int | None = None

    @classmethod
    def of(
        cls, n: int, lanes: int, chunk_size: int, offset: int = 0, total: int | None = None
    ) -> LaneSplit:
        return cls(n, lanes, max(1, min(chunk_size, n // lanes)), offset % lanes, total)

    @cached_property
    def full(self) -> _Pass:
        return _Pass.of(self.n, self.chunk, self.lanes)

    @property
    def full_passes(self) -> int | None:
        """Whole passes of a finite curriculum (the partial last one not counted)."""
        return None if self.total is None else self.total // self.n

    @cached_property
    def last(self) -> _Pass:
        """The partial last pass of a finite curriculum (``m == 0`` if there is none)."""
        assert self.total is not None
        return _Pass.of(self.total % self.n, self.chunk, self.lanes)

    def extras(self) -> int:
        """Longer pieces dealt over the whole curriculum, modulo ``lanes`` (where the next
        dataset's staircase starts, relative to this one's ``offset``); for an infinite
        curriculum, those of the first pass."""
        if self.total is None:
            return self.full.r
        return (self.total // self.n * self.full.r + self.last.r) % self.lanes

    def _before(self, lane: int, p: np.ndarray) -> np.ndarray:
        """Draws lane ``lane`` gets in the whole passes before pass ``p`` (array)."""
        f = self.full
        a = f.base * self.chunk + f.q
        u = (lane - self.offset) % self.lanes
        extra = np.where(p * f.r > u, (p * f.r - 1 - u) // self.lanes + 1, 0)
        return np.asarray(p * a + extra)

    @property
    def cutoff(self) -> int:
        """The last pass a re-laning generation had taken over (none: ``-1``)."""
        return -1

    @property
    def frontier(self) -> int:
        """The first draw of the multi-pass order not dealt (a finite curriculum's total)."""
        return self.total or 0

    @property
    def planned(self) -> int:
        """The draws of the whole curriculum this split deals (0: infinite)."""
        return self.total or 0

    def drawn_before(self, lane: int, p: int) -> int:
        """Draws lane ``lane`` gets in the whole passes before pass ``p``."""
        return int(self._before(lane, np.array([p]))[0])

    def share(self, lane: int, p: int) -> int:
        """Draws lane ``lane`` gets in pass ``p``."""
        return int(self._before(lane, np.array([p + 1]))[0] - self._before(lane, np.array([p]))[0])

    def quota(self, lane: int) -> int | None:
        """Draws lane ``lane`` gets in the whole curriculum (``None``: infinite)."""
        if self.total is None:
            return None
        passes = self.total // self.n
        last = self.last
        start = (self.offset + passes * self.full.r) % self.lanes
        extra = int((lane - start) % self.lanes < last.r)
        whole = int(self._before(lane, np.array([passes]))[0])
        return whole + last.base * self.chunk + last.q + extra

    def _pass_of(self, lane: int, k: np.ndarray) -> np.ndarray:
        """The pass holding each of lane ``lane``'s draws ``k``: the largest ``p`` whose
        passes before hold at most ``k`` draws of the lane (within the whole passes)."""
        lanes, n = self.lanes, self.n
        lo = np.maximum(0, (k - 1) * lanes // n)
        hi = (k + 1) * lanes // n + 2  # exclusive: _before(hi) > k for sure
        if self.total is not None:
            hi = np.minimum(hi, self.total // n + 1)
            lo = np.minimum(lo, hi - 1)
        while True:  # binary search, a few rounds (one if the lane gets >= 1 draw per pass)
            open_ = hi - lo > 1
            if not open_.any():
                return np.asarray(lo, dtype=np.int64)
            mid = (lo + hi) // 2
            ok = self._before(lane, mid) <= k
            lo = np.where(open_ & ok, mid, lo)
            hi = np.where(open_ & ~ok, mid, hi)

    def _pass_at(self, lane: int, k: int) -> int:
        """:meth:`_pass_of` of one draw, in plain integers (cheaper for one value)."""
        f, lanes = self.full, self.lanes
        a, u = f.base * self.chunk + f.q, (lane - self.offset) % lanes

        def before(p: int) -> int:
            return p * a + ((p * f.r - 1 - u) // lanes + 1 if p * f.r > u else 0)

        lo, hi = max(0, (k - 1) * lanes // self.n), (k + 1) * lanes // self.n + 2
        if self.total is not None:
            hi = min(hi, self.total // self.n + 1)
            lo = min(lo, hi - 1)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if before(mid) <= k else (lo, mid)
        return lo

    def _params(self, p: int) -> tuple[_Pass, int]:
        """How pass ``p`` is dealt, and the lane where its longer pieces start."""
        start = (self.offset + p * self.full.r) % self.lanes
        if self.total is not None and p == self.total // self.n:
            return self.last, start
        return self.full, start

    def ranks(self, lane: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pass, rank)`` of the ``k``-th draws of lane ``lane`` (int64 array, ascending)."""
        if len(k) == 0:
            return k.copy(), k.copy()
        c, lanes = self.chunk, self.lanes
        first, last = self._pass_at(lane, int(k[0])), self._pass_at(lane, int(k[-1]))
        if first == last:  # the usual case: one pass, parameters are scalars
            j = k - int(self._before(lane, np.array([first]))[0])
            deal, start = self._params(first)
            rounds = deal.base * c
            if int(j[-1]) < rounds:
                chunk_, o = np.divmod(j, c)
                return np.full(len(k), first, np.int64), (lane + chunk_ * lanes) * c + o
            passes = np.full(len(k), first, np.int64)
            base, q, r = deal.base, deal.q, deal.r
            starts: np.ndarray | int = start
        else:
            passes = self._pass_of(lane, k)
            j = k - self._before(lane, passes)
            f = self.full
            base_a = np.full(len(k), f.base, dtype=np.int64)
            q_a = np.full(len(k), f.q, dtype=np.int64)
            r_a = np.full(len(k), f.r, dtype=np.int64)
            if self.total is not None and self.total % self.n:
                partial = passes == self.total // self.n
                if partial.any():
                    d = self.last
                    base_a[partial], q_a[partial], r_a[partial] = d.base, d.q, d.r
            base, q, r = base_a, q_a, r_a  # type: ignore[assignment]
            starts = (self.offset + passes * f.r) % lanes
        in_rounds = j < base * c
        chunk_, o = np.divmod(j, c)
        rank_rounds = (lane + chunk_ * lanes) * c + o
        piece = (
            base * c * lanes
            + lane * q
            + _extras_before(lane, np.asarray(starts), np.asarray(r), lanes)
        )
        rank = np.where(in_rounds, rank_rounds, piece + j - base * c)
        return passes.astype(np.int64), rank.astype(np.int64)

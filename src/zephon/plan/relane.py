"""Re-laning: a curriculum cut at a checkpoint and dealt to a different number of lanes.

A *generation* starts when a checkpoint of ``L`` lanes is restored into ``L'`` lanes. For each
dataset, what the old lanes had not drawn yet (each old lane's draws from its cut on) is joined
into one sequence ``V`` (old lane 0's rest, then old lane 1's, ...), limited to the passes the
old lanes had reached (``cutoff``); ``V`` is dealt to the new lanes like a pass of its own
(fairly, by :class:`~zephon.plan.lanes.LaneSplit`), and the passes after the cutoff are dealt
to the new lanes afresh. In a finite curriculum ``V`` is simply everything left.

Nothing is lost or drawn twice: the new lanes together draw exactly the old lanes' remaining
draws (and the later passes). The order after the cut changes (the new lanes mix afresh);
generations nest, so a run can be re-laned again and again. A generation is recorded in the
checkpoint as the old lane count and each old lane's cut (draws per dataset): a few numbers
per old lane.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from zephon.arrays import distinct
from zephon.plan.lanes import LaneSplit

__all__ = ["Draws", "Relaned", "Shifted"]


class Draws(Protocol):
    """How one dataset's draws are dealt to lanes (a :class:`LaneSplit` or a generation)."""

    @property
    def lanes(self) -> int: ...

    def ranks(self, lane: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]: ...

    def quota(self, lane: int) -> int | None: ...

    def drawn_before(self, lane: int, p: int) -> int: ...

    def extras(self) -> int: ...

    @property
    def cutoff(self) -> int: ...

    @property
    def frontier(self) -> int: ...

    @property
    def planned(self) -> int: ...


@dataclass(frozen=True)
class Shifted:
    """A lane split of the passes from ``first`` on (pass ``p`` of the split is pass
    ``first + p`` of the dataset)."""

    split: LaneSplit
    first: int

    @property
    def lanes(self) -> int:
        return self.split.lanes

    @property
    def cutoff(self) -> int:
        return self.first - 1

    @property
    def frontier(self) -> int:
        return 0  # an infinite curriculum's: not used

    @property
    def planned(self) -> int:
        return 0

    def ranks(self, lane: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        passes, ranks = self.split.ranks(lane, k)
        return passes + self.first, ranks

    def quota(self, lane: int) -> int | None:
        return self.split.quota(lane)

    def drawn_before(self, lane: int, p: int) -> int:
        return self.split.drawn_before(lane, max(0, p - self.first))

    def extras(self) -> int:
        return self.split.extras()


class Relaned:
    """A dataset's draws for the lanes of a new generation.

    Args:
        parent: the old lanes' draws.
        cuts: per old lane, the draws it had made at the checkpoint.
        lanes, chunk_size, offset: the new lane split.
        n: samples per pass; ``infinite``: whether the curriculum never ends.
        total: a finite curriculum's draws of the dataset in all (``None``: the parent's).
            When a restore changed the curriculum's future, fewer than the old lanes had
            left take the first of them; more take, after them, the draws that follow the
            parent's in the dataset's multi-pass order.
    """

    def __init__(
        self,
        parent: Draws,
        cuts: list[int],
        lanes: int,
        chunk_size: int,
        n: int,
        offset: int,
        infinite: bool,
        total: int | None = None,
    ) -> None:
        self.parent = parent
        self.lanes = lanes
        self.n = n
        old = range(parent.lanes)
        if infinite:  # the old lanes' rest of the passes they have reached
            reached = [int(parent.ranks(i, np.array([cuts[i]], np.int64))[0][0]) for i in old]
            self._cutoff = max([parent.cutoff, *reached])
            ends = [parent.drawn_before(i, self._cutoff + 1) for i in old]
        else:
            self._cutoff = parent.cutoff
            ends = [q if q is not None else 0 for q in (parent.quota(i) for i in old)]
        self.cuts = np.array(cuts, np.int64)
        lengths = np.maximum(0, np.array(ends, np.int64) - self.cuts)
        self._starts = np.concatenate(([0], np.cumsum(lengths)))
        size = int(self._starts[-1])
        self.frontier = parent.frontier  # the first draw of the multi-pass order not dealt yet
        self.planned = parent.planned if total is None else total
        if not infinite and self.planned != parent.planned:  # the future changed on restore
            want = max(0, size + self.planned - parent.planned)
            self.frontier += max(0, want - size)
            size = want
        self._old = int(self._starts[-1])  # positions past these extend the parent's draws
        self.rest = LaneSplit.of(size, lanes, chunk_size, offset, size) if size else None
        self.tail: Shifted | None = None
        if infinite:
            after = offset + (self.rest.extras() if self.rest is not None else 0)
            self.tail = Shifted(LaneSplit.of(n, lanes, chunk_size, after), self._cutoff + 1)

    @property
    def cutoff(self) -> int:
        return self._cutoff

    def _rest_share(self, lane: int) -> int:
        return 0 if self.rest is None else int(self.rest.quota(lane) or 0)

    def quota(self, lane: int) -> int | None:
        return None if self.tail is not None else self._rest_share(lane)

    def drawn_before(self, lane: int, p: int) -> int:
        """Draws of the lane in the passes before ``p`` (``p`` past the cutoff)."""
        tail = self.tail.drawn_before(lane, p) if self.tail is not None else 0
        return self._rest_share(lane) + tail

    def extras(self) -> int:
        rest = self.rest.extras() if self.rest is not None else 0
        return (rest + (self.tail.extras() if self.tail is not None else 0)) % self.lanes

    def ranks(self, lane: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pass, rank)`` of the lane's ``k``-th draws (ascending)."""
        share = self._rest_share(lane)
        passes = np.empty(len(k), np.int64)
        ranks = np.empty(len(k), np.int64)
        early = k < share
        if early.any():
            assert self.rest is not None
            _, at = self.rest.ranks(lane, k[early])  # positions in the old lanes' rest
            p, r = self._rest_ranks(at)
            passes[early], ranks[early] = p, r
        if not early.all():
            assert self.tail is not None
            passes[~early], ranks[~early] = self.tail.ranks(lane, k[~early] - share)
        return passes, ranks

    def _rest_ranks(self, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pass, rank)`` of positions ``at`` of the rest: the old lanes' draws left, then
        (a finite curriculum grown on restore) those after the parent's."""
        passes = np.empty(len(at), np.int64)
        ranks = np.empty(len(at), np.int64)
        grown = at >= self._old
        if grown.any():
            draw = self.parent.frontier + at[grown] - self._old
            passes[grown], ranks[grown] = np.divmod(draw, self.n)
        if not grown.all():
            at = at[~grown]
            old = np.searchsorted(self._starts, at, side="right") - 1
            drawn = self.cuts[old] + at - self._starts[old]
            p = np.empty(len(at), np.int64)
            r = np.empty(len(at), np.int64)
            for i in distinct(old):
                mask = old == i
                p[mask], r[mask] = self.parent.ranks(i, drawn[mask])
            passes[~grown], ranks[~grown] = p, r
        return passes, ranks

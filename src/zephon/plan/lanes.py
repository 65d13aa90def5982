"""How one dataset's per-pass order is dealt out to lanes.

A pass's order is cut into chunks of ``c`` consecutive ranks; chunk ``j`` belongs to lane
``j % lanes``. So each lane holds a fixed subset of every pass (fixed by ``lanes`` and the
dataset's size only), lanes are disjoint and together complete, and a lane's share of a pass is
known in O(1): no lane ever needs another lane's progress.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["LaneSplit"]


@dataclass(frozen=True)
class LaneSplit:
    """The lane split of one dataset of ``n`` samples.

    Attributes:
        n: samples per pass.
        lanes: number of lanes.
        chunk: ranks per chunk (at most the planner's chunk size; smaller for datasets too
            small to give every lane a full chunk).
    """

    n: int
    lanes: int
    chunk: int

    @classmethod
    def of(cls, n: int, lanes: int, chunk_size: int) -> LaneSplit:
        return cls(n, lanes, max(1, min(chunk_size, n // lanes)))

    def lane_size(self, lane: int) -> int:
        """Samples of one pass that lane ``lane`` holds."""
        chunks = -(-self.n // self.chunk)
        mine = max(0, -(-(chunks - lane) // self.lanes))
        size = mine * self.chunk
        last = chunks - 1
        if mine and last % self.lanes == lane:
            size -= chunks * self.chunk - self.n  # the short final chunk is this lane's
        return size

    def ranks(self, lane: int, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(pass, rank)`` of the ``k``-th samples of lane ``lane``'s stream (all passes)."""
        per_pass = self.lane_size(lane)
        passes, r = np.divmod(k, per_pass)
        i, o = np.divmod(r, self.chunk)
        return passes, (lane + i * self.lanes) * self.chunk + o

"""Small numpy helpers for planning, where arrays are a chunk long and calls are many."""

from __future__ import annotations

import numpy as np

__all__ = ["distinct"]


def distinct(values: np.ndarray) -> list[int]:
    """The distinct values of an integer array, ascending, as Python ints.

    Planning arrays usually hold one value (one dataset, block, window or pass per chunk):
    that case costs two reductions instead of a sort or a hash table. Values within a narrow
    range (shards of a chunk, windows of a block) are counted instead of sorted.
    """
    if len(values) == 0:
        return []
    low, high = int(values.min()), int(values.max())
    if low == high:
        return [low]
    if high - low < 4 * len(values):
        return (np.flatnonzero(np.bincount(values - low)) + low).tolist()
    return np.unique(values).tolist()  # type: ignore[no-any-return]

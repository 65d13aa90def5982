"""Small numpy helpers (layer 0) for planning and decoding, where arrays are a chunk long and
calls are many."""

from __future__ import annotations

import mmap
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["distinct", "empty", "in_order", "per_distinct", "stack"]

# numpy asks the kernel for huge pages (madvise) for arrays from this size on. Where the
# kernel then compacts memory on the first touch (``defrag`` = ``madvise``, a common
# default), one such allocation in ten to sixty stalled for 0.15-0.5 s here (38 MB: a batch
# of 256 images); plain pages cost 20-30 ms for the same copy, every time (benchmarks/pages.py).
_HUGE_PAGE_BYTES = 4 << 20


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


def per_distinct(values: np.ndarray, fn: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``fn(values)`` for an elementwise ``fn``, evaluated once per distinct value: a chunk's
    ranks fall in a few runs or window slots, so this spares most of a costly ``fn``."""
    uniq = np.array(distinct(values), dtype=np.int64)
    if len(uniq) == 0:
        return np.zeros(0, dtype=np.int64)
    images = fn(uniq)
    where = np.searchsorted(uniq, values) if len(uniq) > 1 else np.zeros(len(values), np.int64)
    out: np.ndarray = images[where]
    return out


def in_order(keys: tuple[np.ndarray, ...], within: np.ndarray) -> bool:
    """Whether rows are sorted by ``keys`` (most significant first) wherever consecutive rows
    share ``within`` (a nondecreasing group id, such as the chunk): then a lexsort by
    ``(within, *keys)`` would leave them in place. A few elementwise passes, against sorts
    and gathers of every key."""
    if len(within) < 2:
        return True
    tied = within[1:] == within[:-1]  # pairs whose order the keys still decide
    for key in keys:
        step = key[1:] - key[:-1]
        if bool((tied & (step < 0)).any()):
            return False
        tied &= step == 0
    return True


class _Regions:
    """Mappings of arrays that are gone, kept (up to ``keep_bytes``) for the next array of
    the same size: a batch of images written into fresh pages spent most of its time
    faulting them in (38.5 MB: 22 ms, against 5 ms into pages written before; numpy's own
    allocation: 9 ms, with its stalls). A mapping comes back when no array over it is left:
    numpy points every view at the first array over a buffer (the base chain stops at an
    array whose base is no array), and that one is watched by a weak reference."""

    def __init__(self, keep_bytes: int) -> None:
        self.keep_bytes = keep_bytes
        self.free: list[mmap.mmap] = []  # oldest first
        self.kept = 0
        self.lock = threading.Lock()

    def array(self, nbytes: int, dtype: np.dtype[Any], shape: tuple[int, ...]) -> np.ndarray:
        size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
        region = None
        with self.lock:
            for i in range(len(self.free) - 1, -1, -1):  # the newest of its size
                if len(self.free[i]) == size:
                    region = self.free.pop(i)
                    self.kept -= size
                    break
        if region is None:
            # Private: a process forked later (a DataLoader worker) gets copies on write;
            # shared pages let its writes reach this process's batches, and the other way.
            region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        flat = np.frombuffer(region, dtype, nbytes // dtype.itemsize)
        weakref.finalize(flat, self.give, region).atexit = False
        return flat.reshape(shape)  # a view of ``flat``, as every view of it will be

    def give(self, region: mmap.mmap) -> None:
        """``region``'s arrays are all gone: keep it for the next one; the oldest kept go
        past ``keep_bytes`` (sizes that stopped coming, say)."""
        with self.lock:
            self.free.append(region)
            self.kept += len(region)
            while self.kept > self.keep_bytes:
                self.kept -= len(self.free.pop(0))


_REGIONS = _Regions(keep_bytes=192 << 20)  # a few batches of images


def empty(shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> np.ndarray:
    """A new, uninitialised array; a large one on plain anonymous pages, never madvised
    for huge pages, so writing it never waits for the kernel to compact memory (see
    ``_HUGE_PAGE_BYTES``), and on pages an array of its size left if there are (see
    ``_Regions``). Batches and arrays handed to the trainer are allocated here."""
    kind = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * kind.itemsize
    if nbytes < _HUGE_PAGE_BYTES or kind.hasobject:  # objects cannot live in a buffer
        return np.empty(shape, kind)
    return _REGIONS.array(nbytes, kind, shape)


def stack(values: Sequence[np.ndarray]) -> np.ndarray:
    """``np.stack(values)`` (arrays of one shape and dtype) into an :func:`empty` array."""
    first = values[0]
    out = empty((len(values), *first.shape), first.dtype)
    np.stack(values, out=out)
    return out

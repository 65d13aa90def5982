"""The child-process engine's shared-memory slots: each large numeric numpy array of an item is
written into one of a few shared-memory segments by the child and copied out by the parent
with one ``memcpy``; the rest of the item travels pickled, a :class:`Placeholder` where each
array was.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from zephon.arrays import empty
from zephon.engine import janitor

__all__ = ["SLOTS", "Placeholder", "Slots", "join", "split"]

SLOTS = 4  # items with shared-memory arrays prepared ahead of the consumer
_ALIGN = 64
# Smaller arrays travel pickled with the rest of the item: a slot's round trip (a write there,
# a copy and a "free" message back here) costs the trainer more than they do (batches of 64
# ids: benchmarks/peers.py, docs/decisions/trainer-cpu.md).
_MIN_ARRAY = 1 << 16
_count = itertools.count()


class Placeholder:
    """Where an array of the item lies in its slot (a placeholder in the pickled rest)."""

    __slots__ = ("dtype", "offset", "shape")

    def __init__(self, offset: int, dtype: str, shape: tuple[int, ...]) -> None:
        self.offset, self.dtype, self.shape = offset, dtype, shape

    def __reduce__(self) -> tuple[Any, ...]:
        return Placeholder, (self.offset, self.dtype, self.shape)


def _tree(item: Any, leaf: Callable[[Any], Any]) -> Any:
    """``item`` rebuilt with ``leaf`` applied to every value inside its dicts, lists and
    tuples (in order)."""
    if isinstance(item, dict):
        return {k: _tree(v, leaf) for k, v in item.items()}
    if isinstance(item, list):
        return [_tree(v, leaf) for v in item]
    if type(item) is tuple:
        return tuple(_tree(v, leaf) for v in item)
    return leaf(item)


def split(item: Any, arrays: list[np.ndarray]) -> Any:
    """``item`` with each large numeric array replaced by a placeholder (the arrays appended
    to ``arrays``; their offsets are set when a slot is written)."""

    def leaf(x: Any) -> Any:
        if isinstance(x, np.ndarray) and x.dtype.kind in "biufc" and x.nbytes >= _MIN_ARRAY:
            arrays.append(np.ascontiguousarray(x))
            return Placeholder(0, x.dtype.str, x.shape)
        return x

    return _tree(item, leaf)


def join(item: Any, buf: memoryview) -> Any:
    """The item back, each placeholder replaced by a copy of its array out of ``buf``."""

    def leaf(x: Any) -> Any:
        if not isinstance(x, Placeholder):
            return x
        out = empty(x.shape, np.dtype(x.dtype))  # plain pages: the trainer's thread copies
        out[...] = np.frombuffer(buf, out.dtype, out.size, x.offset).reshape(x.shape)
        return out

    return _tree(item, leaf)


def _placeholders(item: Any) -> list[Placeholder]:
    """The placeholders of a split item, in the order :func:`split` appended arrays."""
    found: list[Placeholder] = []
    _tree(item, lambda x: found.append(x) if isinstance(x, Placeholder) else None)
    return found


class Slots:
    """The child's shared-memory slots; one is free again when the parent has copied out of
    it (``release`` is called from the control thread). A slot grows (a new segment) when an
    item needs more room."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.segments: list[SharedMemory | None] = [None] * SLOTS
        self.free = asyncio.Semaphore(SLOTS)
        self.idle = list(range(SLOTS))
        self.stopped = False  # the parent wants nothing more
        self._changed = asyncio.Event()

    async def write(self, arrays: list[np.ndarray], rest: Any) -> tuple[int, str]:
        await self.free.acquire()
        slot = self.idle.pop()
        need, at = 0, []
        for a in arrays:
            at.append(need)
            need += -(-a.nbytes // _ALIGN) * _ALIGN
        shm = self.segments[slot]
        if shm is None or shm.size < need:
            if shm is not None:
                shm.close()
                shm.unlink()
            janitor.ensure()  # removes it if this process tree is killed outright
            name = f"{janitor.owner_prefix()}e{next(_count):x}"
            shm = self.segments[slot] = SharedMemory(name, create=True, size=max(need, 1 << 20))
        for a, offset, holder in zip(arrays, at, _placeholders(rest), strict=True):
            np.ndarray(a.shape, a.dtype, shm.buf, offset)[...] = a
            holder.offset = offset
        return slot, shm.name

    def release(self, slot: int) -> None:
        def free() -> None:
            self.idle.append(slot)
            self.free.release()
            self._changed.set()

        self.loop.call_soon_threadsafe(free)

    def stop(self) -> None:
        self.stopped = True
        self._changed.set()

    async def settled(self) -> None:
        """Until the parent has copied out of every slot, or wants nothing more. It opens a
        segment when it reaches the item: one unlinked before that is gone (the run's last
        items in a slot first used near the end, while the parent was items behind)."""
        while len(self.idle) < SLOTS and not self.stopped:
            self._changed.clear()
            await self._changed.wait()

    def close(self) -> None:
        for shm in self.segments:
            if shm is not None:
                shm.close()
                with contextlib.suppress(FileNotFoundError):
                    shm.unlink()

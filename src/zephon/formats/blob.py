"""The fetched bytes of one read: byte ranges of one shard."""

from __future__ import annotations

import bisect
from collections.abc import Sequence

__all__ = ["Blob", "Bytes"]

Bytes = bytes | memoryview  # fetched bytes: a read of its own, or a view of a cached one


class Blob:
    """Byte ranges of one shard, addressed by shard offsets.

    Args:
        parts: ``(start, data)`` pairs, non-overlapping, sorted by ``start``.
    """

    __slots__ = ("_ends", "_parts", "_starts")

    def __init__(self, parts: Sequence[tuple[int, Bytes]]) -> None:
        self._parts = list(parts)
        self._starts = [start for start, _ in self._parts]
        self._ends = [start + len(data) for start, data in self._parts]

    @property
    def parts(self) -> list[tuple[int, Bytes]]:
        return self._parts

    @property
    def nbytes(self) -> int:
        return sum(len(data) for _, data in self._parts)

    def slice(self, start: int, stop: int) -> memoryview:
        """Bytes ``[start, stop)``, which must lie inside one fetched range."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0 or stop > self._ends[i]:
            raise KeyError(f"bytes [{start}, {stop}) were not fetched")
        base = self._starts[i]
        return memoryview(self._parts[i][1])[start - base : stop - base]

    def bytes(self, start: int, stop: int) -> bytes:
        """Like :meth:`slice`, as a ``bytes`` copy (for parsers that need ``bytes``)."""
        i = bisect.bisect_right(self._starts, start) - 1
        if i < 0 or stop > self._ends[i]:
            raise KeyError(f"bytes [{start}, {stop}) were not fetched")
        base = self._starts[i]
        data = self._parts[i][1][start - base : stop - base]
        return data if isinstance(data, bytes) else bytes(data)

    def covers(self, start: int, stop: int) -> bool:
        i = bisect.bisect_right(self._starts, start) - 1
        return i >= 0 and stop <= self._ends[i]

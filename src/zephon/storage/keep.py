"""Bytes a discovery scan read, kept so that the first epoch does not fetch them again.

Formats without random-access metadata (plain JSONL, tar) are discovered by reading every
shard once. Without this, the first epoch of a dataset with no index reads each of those shards
twice. A :class:`ScanKeep` holds the scan's chunks (up to a byte capacity), a storage client
serves any read lying inside them from memory, and each chunk is let go once reads have taken
(nearly) all of it, so the memory drains as the epoch advances; :meth:`ScanKeep.clear` drops
what is left when the pipeline that owns it stops. A pipeline counts what it holds in its
fetch budget (:meth:`ScanKeep.trim` to fit), so kept bytes never add to the memory the
budget promises.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

__all__ = ["ScanKeep"]

_SLACK = 16 << 10  # a chunk is let go when all but this much was served (a tar's trailer)


@dataclass
class _Chunks:
    starts: list[int] = field(default_factory=list)
    data: list[bytes] = field(default_factory=list)
    served: list[int] = field(default_factory=list)


class ScanKeep:
    """Scanned bytes by (object, version), at most ``capacity`` of them.

    Not thread-safe: filled by discovery, then read by one pipeline's event loop.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0
        self.served_bytes = 0
        self._objects: dict[tuple[str, str], _Chunks] = {}

    def __repr__(self) -> str:
        return f"ScanKeep(objects={len(self._objects)}, held={self.held}, capacity={self.capacity})"

    def keep(self, uri: str, version: str, start: int, data: bytes) -> None:
        """Hold ``data`` (bytes ``start`` on of ``uri``) if there is room; chunks of one object
        must come in order (a scan's)."""
        if not data or self.held + len(data) > self.capacity:
            return
        chunks = self._objects.setdefault((uri, version), _Chunks())
        if chunks.starts and start < chunks.starts[-1] + len(chunks.data[-1]):
            return  # out of order or overlapping: not a scan's chunk
        chunks.starts.append(start)
        chunks.data.append(bytes(data))
        chunks.served.append(0)
        self.held += len(data)

    def take(self, uri: str, version: str, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` if kept chunks cover them without a hole, else ``None``."""
        chunks = self._objects.get((uri, version))
        if chunks is None or stop <= start:
            return None
        i = bisect.bisect_right(chunks.starts, start) - 1
        if i < 0:
            return None
        pieces: list[tuple[int, int, int]] = []  # (chunk, from, to) within the chunk
        at = start
        j = i
        while at < stop:
            if j >= len(chunks.starts) or chunks.starts[j] > at:
                return None  # a hole: not kept (capacity ran out) or already let go
            begin = at - chunks.starts[j]
            end = min(len(chunks.data[j]), stop - chunks.starts[j])
            if end <= begin:
                return None
            pieces.append((j, begin, end))
            at = chunks.starts[j] + end
            j += 1
        out = b"".join(chunks.data[k][a:b] for k, a, b in pieces)
        self.served_bytes += len(out)
        for k, a, b in pieces:
            chunks.served[k] += b - a
        self._let_go(uri, version, chunks, [k for k, _, _ in pieces])
        return out

    def _let_go(self, uri: str, version: str, chunks: _Chunks, touched: list[int]) -> None:
        for k in reversed(touched):
            size = len(chunks.data[k])
            if chunks.served[k] >= size - min(_SLACK, size // 64):
                self.held -= size
                del chunks.starts[k], chunks.data[k], chunks.served[k]
        if not chunks.starts:
            del self._objects[(uri, version)]

    def trim(self, capacity: int) -> None:
        """Keep at most ``capacity`` bytes: each object's first chunks, in scan order."""
        room = capacity
        for key in list(self._objects):
            chunks = self._objects[key]
            fits = 0
            while fits < len(chunks.data) and len(chunks.data[fits]) <= room:
                room -= len(chunks.data[fits])
                fits += 1
            self.held -= sum(len(data) for data in chunks.data[fits:])
            del chunks.starts[fits:], chunks.data[fits:], chunks.served[fits:]
            if not chunks.starts:
                del self._objects[key]
        self.capacity = min(self.capacity, capacity)

    def clear(self) -> None:
        """Let go of everything."""
        self._objects.clear()
        self.held = 0

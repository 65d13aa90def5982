"""Bytes a discovery scan read, kept so that the first epoch does not fetch them again.

Formats without random-access metadata (plain JSONL, tar) are discovered by reading every
shard once. Without this, the first epoch of a dataset with no index reads each of those shards
twice. Parquet's footer probe (the last 64 KiB, most of it the last row group's data when files
are small) is kept too: a read whose end it covers fetches only the rest. A :class:`ScanKeep`
holds the scan's chunks (up to a byte capacity in memory, and past that up to a second capacity
in an unnamed temporary file, which the system removes when it is closed or the process ends),
a storage client serves any read lying inside them from there, and each chunk is let go once
reads have taken (nearly) all of it, so the memory drains as the epoch advances;
:meth:`ScanKeep.clear` drops what is left when the pipeline that owns it stops. A pipeline
counts what it holds in memory in its fetch budget (:meth:`ScanKeep.trim` moves the rest to the
file), so kept bytes never add to the memory the budget promises. Reads from the file are
page-cache reads of a local file: far cheaper than a second request to the store. The file
is written on a thread of its own, so the scan goes on receiving meanwhile.
"""

from __future__ import annotations

import bisect
import ctypes
import os
import shutil
import tempfile
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO

__all__ = ["ScanKeep"]

_SLACK = 16 << 10  # a chunk is let go when all but this much was served (a tar's trailer)
_UNWRITTEN = 64 << 20  # spilled bytes waiting for the disk before a spill waits for them


def _write_all(fd: int, data: bytes, at: int) -> None:
    view = memoryview(data)
    while view:
        done = os.pwrite(fd, view, at)
        view, at = view[done:], at + done


class _Writes:
    """Appends to the spill file on a thread of their own, so the scan's event loop goes on
    receiving while the disk takes them (a tar scan spent a quarter of its time in
    ``pwrite``); a read of spilled bytes waits for their write, and one that failed (a full
    disk) reads as missing, so the bytes are fetched again."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.owner = os.getpid()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="zephon-spill")
        self._pending: dict[int, tuple[int, Future[None]]] = {}  # at -> (size, write)
        self._failed: set[int] = set()
        _LIVE.add(self)

    def flush(self) -> None:
        """Wait for every pending write (before a fork: the child gets none of this
        process's threads, so what it inherits must be on disk already)."""
        if self.owner == os.getpid():
            for at in list(self._pending):
                self.settle(at, quiet=True)

    def write(self, data: bytes, at: int) -> None:
        self._forget_written()
        while self._pending and sum(n for n, _ in self._pending.values()) > _UNWRITTEN:
            self.settle(next(iter(self._pending)), quiet=True)  # the disk is behind: wait
        self._pending[at] = (len(data), self._pool.submit(_write_all, self.fd, data, at))

    def settle(self, at: int, quiet: bool = False) -> None:
        """Return once the chunk written at ``at`` is on disk; ``OSError`` if it never will
        be (its write failed, or it was pending when this process was forked)."""
        entry = self._pending.get(at)
        if entry is not None:
            write = entry[1]
            if not write.done() and self.owner != os.getpid():
                self._failed.add(at)  # the writing thread stayed in the parent
            else:
                try:
                    write.result()
                except OSError:
                    self._failed.add(at)
                del self._pending[at]
        if at in self._failed and not quiet:
            raise OSError("the scan's temporary file could not hold these bytes")

    def _forget_written(self) -> None:
        for at in [a for a, (_, w) in self._pending.items() if w.done()]:
            self.settle(at, quiet=True)

    def close(self) -> None:
        for _, write in self._pending.values():
            write.cancel()
        if self.owner == os.getpid():
            self._pool.shutdown(wait=True)
        self._pending.clear()


@dataclass
class _Chunks:
    starts: list[int] = field(default_factory=list)
    data: list[bytes | int] = field(default_factory=list)  # bytes, or where in the file
    sizes: list[int] = field(default_factory=list)
    served: list[int] = field(default_factory=list)


class ScanKeep:
    """Scanned bytes by (object, version): ``capacity`` of them in memory, then up to
    ``disk_capacity`` more in a temporary file in ``disk_dir`` (the system's temporary
    directory by default; never more than half its free space).

    Not thread-safe: filled by discovery, then read by one pipeline's event loop.
    """

    def __init__(self, capacity: int, disk_capacity: int = 0, disk_dir: str | None = None) -> None:
        self.capacity = capacity
        self.disk_capacity = disk_capacity
        self.disk_dir = disk_dir
        self.held = 0  # in memory
        self.on_disk = 0  # written to the file (its space comes back when the keep is cleared)
        self.served_bytes = 0
        self.spilled_bytes = 0  # ever written to the file
        self._objects: dict[tuple[str, str], _Chunks] = {}
        self._file: IO[bytes] | None = None
        self._writes: _Writes | None = None
        self._owner = os.getpid()  # the process that created the file, the one to append
        # Held by a dataset whose discovery has finished, and no pipeline has taken it: only
        # then may a fork (another thread) move it to the file (see _before_fork).
        self.idle = False
        _KEEPS.add(self)

    def __repr__(self) -> str:
        return (
            f"ScanKeep(objects={len(self._objects)}, held={self.held}, "
            f"capacity={self.capacity}, on_disk={self.on_disk})"
        )

    @property
    def kept(self) -> int:
        """Bytes kept, in memory or on disk."""
        return sum(sum(c.sizes) for c in self._objects.values())

    def keep(self, uri: str, version: str, start: int, data: bytes) -> None:
        """Hold ``data`` (bytes ``start`` on of ``uri``) if there is room; chunks of one object
        must come in order (a scan's)."""
        if not data:
            return
        chunks = self._objects.get((uri, version))
        if chunks is not None and start < chunks.starts[-1] + chunks.sizes[-1]:
            return  # out of order or overlapping: not a scan's chunk
        if self.held + len(data) <= self.capacity:
            stored: bytes | int = bytes(data)
            self.held += len(data)
        else:
            spilled = self._spill(data)
            if spilled is None:
                return
            stored = spilled
        chunks = self._objects.setdefault((uri, version), _Chunks())
        chunks.starts.append(start)
        chunks.data.append(stored)
        chunks.sizes.append(len(data))
        chunks.served.append(0)

    def _spill(self, data: bytes) -> int | None:
        """Append ``data`` to the file; where it went, or ``None`` if there is no room.

        Only the process that created the file appends to it: a forked process (a DataLoader
        worker) shares it, and its appends would land where the others' did, so there it
        serves what it inherited and lets go of what it cannot hold."""
        if self.on_disk + len(data) > self.disk_capacity:
            return None
        if self._file is not None and self._owner != os.getpid():
            return None
        try:
            if self._file is None:
                folder = self.disk_dir or tempfile.gettempdir()
                room = shutil.disk_usage(folder).free // 2
                self.disk_capacity = min(self.disk_capacity, room)
                if len(data) > self.disk_capacity:
                    return None
                # Closed by clear() or when the keep is collected; unnamed, so the system
                # removes it when closed or if the process dies.
                self._file = tempfile.TemporaryFile(dir=folder, prefix="zephon-scan-")  # noqa: SIM115
                self._owner = os.getpid()
                self._writes = _Writes(self._file.fileno())
                self._closer = weakref.finalize(self, _close, self._writes, self._file)
            at = self.on_disk
            assert self._writes is not None
            self._writes.write(bytes(data), at)
        except OSError:  # no temporary directory, or it filled up: fetch those bytes again
            return None
        self.on_disk += len(data)
        self.spilled_bytes += len(data)
        return at

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
            end = min(chunks.sizes[j], stop - chunks.starts[j])
            if end <= begin:
                return None
            pieces.append((j, begin, end))
            at = chunks.starts[j] + end
            j += 1
        try:
            out = b"".join(self._bytes(chunks.data[k], a, b) for k, a, b in pieces)
        except OSError:
            return None
        self.served_bytes += len(out)
        for k, a, b in pieces:
            chunks.served[k] += b - a
        self._let_go(uri, version, chunks, [k for k, _, _ in pieces])
        return out

    def kept_tail(self, uri: str, version: str, start: int, stop: int) -> int | None:
        """Where the kept bytes that end ``[start, stop)`` without a hole begin, when they
        cover its end but not its start (a Parquet footer probe holds the end of the last
        row group); else ``None``."""
        chunks = self._objects.get((uri, version))
        if chunks is None or stop <= start:
            return None
        j = bisect.bisect_right(chunks.starts, stop - 1) - 1
        if j < 0 or chunks.starts[j] + chunks.sizes[j] < stop:
            return None
        while j > 0 and chunks.starts[j - 1] + chunks.sizes[j - 1] == chunks.starts[j]:
            if chunks.starts[j] <= start:
                break
            j -= 1
        cut = chunks.starts[j]
        return cut if start < cut < stop else None

    def _bytes(self, stored: bytes | int, begin: int, end: int) -> bytes:
        if isinstance(stored, bytes):
            return stored[begin:end]
        assert self._file is not None and self._writes is not None
        self._writes.settle(stored)
        got = os.pread(self._file.fileno(), end - begin, stored + begin)
        if len(got) != end - begin:
            raise OSError("the scan's temporary file is shorter than written")
        return got

    def _let_go(self, uri: str, version: str, chunks: _Chunks, touched: list[int]) -> None:
        for k in reversed(touched):
            size = chunks.sizes[k]
            if chunks.served[k] >= size - min(_SLACK, size // 64):
                if isinstance(chunks.data[k], bytes):
                    self.held -= size
                del chunks.starts[k], chunks.data[k], chunks.sizes[k], chunks.served[k]
        if not chunks.starts:
            del self._objects[(uri, version)]

    def trim(self, capacity: int) -> None:
        """Keep at most ``capacity`` bytes in memory: each object's first chunks, in scan
        order; the others move to the file while it has room, or are let go."""
        room = capacity
        for key in list(self._objects):
            chunks = self._objects[key]
            drop = []
            for k, stored in enumerate(chunks.data):
                if not isinstance(stored, bytes):
                    continue
                if len(stored) <= room:
                    room -= len(stored)
                    continue
                self.held -= len(stored)
                spilled = self._spill(stored)
                if spilled is None:
                    drop.append(k)
                else:
                    chunks.data[k] = spilled
            for k in reversed(drop):
                del chunks.starts[k], chunks.data[k], chunks.sizes[k], chunks.served[k]
            if not chunks.starts:
                del self._objects[key]
        self.capacity = min(self.capacity, capacity)

    def clear(self) -> None:
        """Let go of everything (the file too)."""
        self._objects.clear()
        self.held = self.on_disk = 0
        if self._file is not None:
            self._closer()
            self._file = None
            self._writes = None


def _close(writes: _Writes, file: IO[bytes]) -> None:
    writes.close()
    file.close()


_LIVE: weakref.WeakSet[_Writes] = weakref.WeakSet()
_KEEPS: weakref.WeakSet[ScanKeep] = weakref.WeakSet()
_TRIM_CHILD = False  # a scan's keep was moved to the file: children trim their heap


def _before_fork() -> None:
    """Before a fork (a DataLoader starting its workers after discovery in the trainer):
    keeps that discovery filled and no pipeline has taken yet move what they hold in memory
    to the file, which the children share through the page cache, and pending writes reach
    it. A child starts with a copy of its parent's memory (resident in both, counted in
    both): scanned bytes held in the parent were held once per worker more."""
    global _TRIM_CHILD
    idle = [keep for keep in list(_KEEPS) if keep.idle and keep.held]
    for keep in idle:
        keep.trim(0)
    for writes in list(_LIVE):
        writes.flush()
    _TRIM_CHILD = bool(idle) or _TRIM_CHILD


def _after_fork_in_child() -> None:
    """A child forked after a scan gives back the free heap it inherited: the chunks the
    scan received and let go. (The parent keeps its own for reuse: handed back there, it is
    page-faulted back in as the trainer receives the workers' batches, on the trainer's
    CPU.)"""
    if _TRIM_CHILD:
        _return_free_heap()


def _return_free_heap() -> None:
    """Hand the heap's free memory back to the system (glibc's ``malloc_trim``; nothing
    where there is none): freed chunks of a scan's reads otherwise stay resident."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


if hasattr(os, "register_at_fork"):  # a forked DataLoader worker reads what discovery spilled
    os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)

"""A local disk cache of fetched byte ranges, shared by every process on a node.

Layout: one directory per object version (a digest of URI and version), one file per cached
range named ``<start>-<stop>``, and an empty ``eof-<size>`` marker once a read has shown where
the object ends. A read is served when cached ranges cover it (several may, side by side), so
the next epoch's reads hit whatever their grouping.

Sharing rules, for several processes on one directory:

- An entry appears whole or not at all: it is written to a hidden temporary file and renamed
  into place (``os.replace`` is atomic on POSIX). A writer killed mid-write leaves only a
  temporary file, which no reader looks at and eviction removes.
- A reader opens every file it needs before reading; an entry evicted after that stays
  readable through the open descriptor, and one evicted before is a miss, never a torn read.
- Eviction (least recently used first, by modification time, which a hit refreshes) runs in
  one process at a time under an ``fcntl`` lock on ``.lock``, whenever this process has added a
  tenth of the limit since its last pass. Entries are keyed by version, so a rewritten object
  is never served from the cache.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DiskCache"]

_STALE_TMP_S = 300.0  # a temporary file this old belongs to a writer that died


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    hit_bytes: int = 0
    written_bytes: int = 0
    evicted_bytes: int = 0


class DiskCache:
    """Byte ranges of object versions under ``root``, within about ``limit_bytes``."""

    def __init__(self, root: str | Path, limit_bytes: int) -> None:
        if limit_bytes < 1:
            raise ValueError(f"cache_limit_bytes must be >= 1, got {limit_bytes}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.limit_bytes = limit_bytes
        self.stats = CacheStats()
        self._added = 0

    def __repr__(self) -> str:
        return f"DiskCache({str(self.root)!r}, limit_bytes={self.limit_bytes})"

    def _dir(self, uri: str, version: str) -> Path:
        digest = hashlib.sha256(f"{uri}\0{version}".encode()).hexdigest()[:40]
        return self.root / digest[:2] / digest

    def get(self, uri: str, version: str, start: int, stop: int) -> bytes | None:
        """Bytes ``[start, stop)`` (clipped to the object's end, if known) or ``None``."""
        folder = self._dir(uri, version)
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            self.stats.misses += 1
            return None
        ranges, end = _parse(names)
        stop = min(stop, end) if end is not None else stop
        plan = _cover(ranges, start, stop)
        if plan is None:
            self.stats.misses += 1
            return None
        pieces = []
        now = time.time()
        with contextlib.ExitStack() as stack:
            try:  # every file opened first: an entry evicted after this stays readable
                files = [
                    (stack.enter_context(open(folder / f"{a}-{b}", "rb")), a, lo, hi)
                    for a, b, lo, hi in plan
                ]
            except FileNotFoundError:  # evicted between the listing and the open
                self.stats.misses += 1
                return None
            for f, a, lo, hi in files:
                f.seek(lo - a)
                pieces.append(f.read(hi - lo))
                with contextlib.suppress(OSError):
                    os.utime(f.fileno(), (now, now))
        data = b"".join(pieces)
        if len(data) != max(0, stop - start):
            self.stats.misses += 1
            return None
        self.stats.hits += 1
        self.stats.hit_bytes += len(data)
        return data

    def put(self, uri: str, version: str, start: int, data: bytes, end: int | None) -> None:
        """Keep ``data`` (bytes from ``start``); ``end``: the object's size, if now known."""
        if not data and end is None:
            return
        folder = self._dir(uri, version)
        folder.mkdir(parents=True, exist_ok=True)
        if data:
            tmp = folder / f".tmp-{os.getpid()}-{uuid.uuid4().hex}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, folder / f"{start}-{start + len(data)}")
            self.stats.written_bytes += len(data)
            self._added += len(data)
        if end is not None:
            (folder / f"eof-{end}").touch()
        if self._added > self.limit_bytes // 10:
            self._added = 0
            self.evict()

    def evict(self) -> None:
        """Remove least recently used entries until the cache is within 90% of its limit."""
        with open(self.root / ".lock", "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # another process is evicting
            try:
                self._evict_locked()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _evict_locked(self) -> None:
        entries: list[tuple[float, int, Path]] = []
        total = 0
        now = time.time()
        for folder in self.root.glob("??/*"):
            for path in folder.iterdir():
                try:
                    st = path.stat()
                except FileNotFoundError:
                    continue
                if path.name.startswith(".tmp-"):
                    if now - st.st_mtime > _STALE_TMP_S:
                        path.unlink(missing_ok=True)
                    continue
                if not path.name.startswith("eof-"):
                    entries.append((st.st_mtime, st.st_size, path))
                    total += st.st_size
        entries.sort()
        target = int(self.limit_bytes * 0.9)
        for _, size, path in entries:
            if total <= target:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.stats.evicted_bytes += size


def _parse(names: list[str]) -> tuple[list[tuple[int, int]], int | None]:
    ranges = []
    end = None
    for name in names:
        if name.startswith("."):
            continue
        if name.startswith("eof-"):
            end = int(name[4:])
            continue
        a, _, b = name.partition("-")
        if a.isdigit() and b.isdigit():
            ranges.append((int(a), int(b)))
    ranges.sort()
    return ranges, end


def _cover(
    ranges: list[tuple[int, int]], start: int, stop: int
) -> list[tuple[int, int, int, int]] | None:
    """Entries ``(a, b)`` with the part ``[lo, hi)`` of each that together cover
    ``[start, stop)``, or ``None`` if there is a gap."""
    if stop <= start:
        return []
    plan = []
    pos = start
    for a, b in ranges:
        if b <= pos or a > pos:
            if a > pos:
                break
            continue
        hi = min(b, stop)
        plan.append((a, b, pos, hi))
        pos = hi
        if pos >= stop:
            return plan
    return None

"""Worker results through shared memory: large arrays cross without being pickled.

A block's result pickled the usual way copies every array four times (into the pickle, into
the pipe, out of it, out of the pickle), on both sides of the pipe; for decoded images that was
a fifth of each worker's time and most of the parent's. Here the worker pickles the result with
protocol 5, keeping arrays of :data:`OUT_OF_BAND` bytes or more out of the stream, writes those
into one new shared-memory segment and sends the small rest; the parent maps the segment,
unlinks it, copies each array out once and unmaps it: two copies in all, no pipe, no pickle.

A segment exists from its creation to the parent's receipt; the resource tracker the workers
share with the parent removes any left by a process that dies in between, and the pool sweeps
its own prefix when it shuts down. Space is reserved when the segment is made (``ENOSPC``
then, instead of a ``SIGBUS`` on writing into a full ``/dev/shm``), and a result goes the
usual way when shared memory is missing, nearly full or too small to be worth it, or when
the environment says ``ZEPHON_WORKER_SHM=0`` (read by each worker as it starts).
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import mmap
import os
import pickle
from typing import Any

__all__ = ["AVAILABLE", "Packed", "pack", "sweep", "unpack"]

_posixshmem: Any
try:  # CPython's own POSIX shared memory calls (those of multiprocessing.shared_memory)
    _posixshmem = importlib.import_module("_posixshmem")
    from multiprocessing import resource_tracker
except ImportError:  # pragma: no cover - Windows: results are pickled as before
    _posixshmem = None

AVAILABLE = _posixshmem is not None and os.environ.get("ZEPHON_WORKER_SHM", "1") != "0"
OUT_OF_BAND = 64 << 10  # a smaller array stays in the pickle: a copy costs less than a segment
MIN_SEGMENT = 1 << 20  # below this in all, out-of-band arrays travel beside the pickle
_ALIGN = 64
_SHM_DIR = "/dev/shm"
_count = itertools.count()
# Map every page at once: cheaper than one fault per page when a whole result is copied.
_POPULATE = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)


class Packed:
    """A pickled result and where its large buffers lie: a segment's ``name`` and
    ``(offset, size)`` spans, or the buffers themselves (``inline``)."""

    __slots__ = ("data", "inline", "name", "spans")

    def __init__(self, data: bytes, name: str | None, spans: list[tuple[int, int]],
                 inline: list[bytearray]) -> None:  # fmt: skip
        self.data, self.name, self.spans, self.inline = data, name, spans, inline

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self.data, self.name, self.spans, self.inline)


def pack(value: Any, prefix: str) -> Packed:
    """``value`` for the trip to the parent; its segment (if any) is named ``prefix...``."""
    big: list[pickle.PickleBuffer] = []

    def keep_in_band(buffer: pickle.PickleBuffer) -> bool:
        if buffer.raw().nbytes < OUT_OF_BAND:
            return True
        big.append(buffer)
        return False

    data = pickle.dumps(value, protocol=5, buffer_callback=keep_in_band)
    spans, size = [], 0
    for buffer in big:
        spans.append((size, buffer.raw().nbytes))
        size += -(-buffer.raw().nbytes // _ALIGN) * _ALIGN
    name = _segment(prefix, size) if big and size >= MIN_SEGMENT else None
    if name is None:
        return Packed(data, None, [], [bytearray(b.raw()) for b in big])
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        with mmap.mmap(fd, size, flags=_POPULATE) as mapped:
            for buffer, (offset, n) in zip(big, spans, strict=True):
                mapped[offset : offset + n] = buffer.raw()
    finally:
        os.close(fd)
    return Packed(data, name, spans, [])


def _segment(prefix: str, size: int) -> str | None:
    """A new segment of ``size`` bytes, space reserved, or ``None`` if there is no room."""
    if not AVAILABLE or not _room_for(size):
        return None
    name = f"{prefix}{os.getpid():x}_{next(_count):x}"
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    resource_tracker.register("/" + name, "shared_memory")
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate"):
            os.posix_fallocate(fd, 0, size)  # ENOSPC now rather than SIGBUS on writing
    except OSError:
        _unlink(name)
        return None
    finally:
        os.close(fd)
    return name


def _room_for(size: int) -> bool:
    """Whether ``/dev/shm`` (where it exists) holds ``size`` bytes with a wide margin: other
    workers fill it too, and a container's is often only 64 MiB."""
    try:
        st = os.statvfs(_SHM_DIR)
    except OSError:
        return True  # no such folder (macOS): segments live elsewhere
    return st.f_bavail * st.f_frsize >= 4 * size + (64 << 20)


def unpack(packed: Packed) -> Any:
    """The worker's value again, its arrays copied out of the segment, which is then gone."""
    if packed.name is None:
        return pickle.loads(packed.data, buffers=packed.inline)
    fd = _posixshmem.shm_open("/" + packed.name, os.O_RDWR, 0o600)
    try:
        mapped = mmap.mmap(fd, 0, flags=_POPULATE)
    finally:
        os.close(fd)
        _unlink(packed.name)
    # Copied out at once (one memcpy per array) rather than kept as views: a view would keep
    # its whole block's segment alive for as long as any one item of the block lives on (in a
    # shuffle buffer, say), and items must cost their own size, not their block's.
    with mapped, memoryview(mapped) as view:
        buffers = [bytearray(view[o : o + n]) for o, n in packed.spans]
    return pickle.loads(packed.data, buffers=buffers)


def _unlink(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        _posixshmem.shm_unlink("/" + name)
    resource_tracker.unregister("/" + name, "shared_memory")


def sweep(prefix: str) -> int:
    """Unlink segments named ``prefix...`` still in ``/dev/shm`` (results nobody received:
    a worker killed after writing one); how many there were."""
    try:
        names = [n for n in os.listdir(_SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        _unlink(name)
    return len(names)

"""Blocks to and from worker processes through shared memory: large buffers are not pickled.

A block pickled the usual way copies every large buffer four times (into the pickle, into the
pipe, out of it, out of the pickle), on both sides of the pipe: for decoded images a fifth of
each worker's time and most of the parent's. Here the sender pickles with protocol 5, keeping
buffers of :data:`OUT_OF_BAND` bytes or more (numpy and Arrow arrays; the ``bytes`` of fetched
samples, lifted by :func:`pack_args`) out of the stream, writes them into one new
shared-memory segment and sends the small rest; the receiver maps the segment and copies each
buffer out once. Two copies in all, no pipe, no pickle of the payload.

Each segment has one owner who removes it. A result's segment is made by the worker and
removed by the parent as it arrives (whether or not anyone still waits for it); a call's
arguments' segment is made by the parent and removed when the call is over or cancelled. The
resource tracker the workers share with the parent removes any left by a process that dies,
and the pool sweeps its own prefix when it shuts down. Space is reserved when a segment is
made (``ENOSPC`` then, instead of a ``SIGBUS`` on writing into a full ``/dev/shm``), and a
block goes the usual way when shared memory is missing, nearly full or not worth it, or when
the environment says ``ZEPHON_WORKER_SHM=0``.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import mmap
import os
import pickle
from typing import Any

__all__ = ["AVAILABLE", "Packed", "discard", "pack", "pack_args", "sweep", "unpack", "unpack_args"]

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
    """A pickled value and where its large buffers lie: a segment's ``name`` and
    ``(offset, size)`` spans, or the buffers themselves (``inline``)."""

    __slots__ = ("data", "inline", "name", "spans")

    def __init__(self, data: bytes, name: str | None, spans: list[tuple[int, int]],
                 inline: list[bytearray]) -> None:  # fmt: skip
        self.data, self.name, self.spans, self.inline = data, name, spans, inline

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self.data, self.name, self.spans, self.inline)


def pack(value: Any, prefix: str) -> Packed:
    """``value`` for the trip to another process; its segment (if any) is named
    ``prefix...``. A worker packs its results, the parent a call's arguments."""
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


class _Bytes:
    """Large ``bytes`` lifted out of the pickle stream; ``bytes`` again on the other side."""

    __slots__ = ("value",)

    def __init__(self, value: bytes) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return bytes, (pickle.PickleBuffer(self.value),)


def _lift(value: Any, depth: int = 5) -> Any:
    """``value`` with its large ``bytes`` (in plain dicts, lists and tuples: samples and
    blocks of them) marked to travel out of band; pickle never offers ``bytes`` itself. A
    list whose first items hold no large bytes (a block of text) is taken as it is: walking
    every sample would cost several times its pickling."""
    kind = type(value)
    if kind is bytes:
        return _Bytes(value) if len(value) >= OUT_OF_BAND else value
    if depth == 0:
        return value
    if kind is dict:
        return {k: _lift(v, depth - 1) for k, v in value.items()}
    if kind is list and not any(_holds_large(v, depth - 1) for v in value[:4]):
        return value
    if kind is list or kind is tuple:
        return kind(_lift(v, depth - 1) for v in value)
    return value


def _holds_large(value: Any, depth: int) -> bool:
    kind = type(value)
    if kind is bytes:
        return len(value) >= OUT_OF_BAND
    if depth == 0:
        return False
    if kind is dict:
        return any(_holds_large(v, depth - 1) for v in value.values())
    if kind is list or kind is tuple:
        return any(_holds_large(v, depth - 1) for v in value[:4])
    return False


def pack_args(args: tuple[Any, ...], prefix: str) -> Packed:
    """A call's arguments for the trip to a worker (fetched bytes, mostly). This process
    made the segment and removes it when the call is over (:func:`discard`)."""
    return pack(_lift(args), prefix)


def unpack_args(packed: Packed) -> tuple[Any, ...]:
    """In a worker: the call's arguments, their bytes copied out of the caller's segment."""
    if packed.name is None:
        return pickle.loads(packed.data, buffers=packed.inline)  # type: ignore[no-any-return]
    mapped = _map(packed.name)
    view = memoryview(mapped)
    args = pickle.loads(packed.data, buffers=[view[o : o + n] for o, n in packed.spans])
    view.release()
    with contextlib.suppress(BufferError):  # an array argument may still be a view of it
        mapped.close()
    return args  # type: ignore[no-any-return]


def discard(packed: Packed) -> None:
    """Remove the segment of a call's arguments once the call is over (or never ran)."""
    if packed.name is not None:
        _unlink(packed.name)


def _segment(prefix: str, size: int) -> str | None:
    """A new segment of ``size`` bytes, space reserved, or ``None`` if there is no room."""
    if not AVAILABLE or not _room_for(size):
        return None
    name = f"{prefix}{os.getpid():x}_{next(_count):x}"
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:  # out of file descriptors, no permission: the pipe still works
        return None
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
    try:
        mapped = _map(packed.name)
    finally:
        _unlink(packed.name)
    # Copied out at once (one memcpy per array) rather than kept as views: a view would keep
    # its whole block's segment alive for as long as any one item of the block lives on (in a
    # shuffle buffer, say), and items must cost their own size, not their block's.
    with mapped, memoryview(mapped) as view:
        buffers = [bytearray(view[o : o + n]) for o, n in packed.spans]
    return pickle.loads(packed.data, buffers=buffers)


def _map(name: str) -> mmap.mmap:
    """The segment ``name``, mapped read-only, every page at once."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDONLY, 0o600)
    try:
        return mmap.mmap(fd, 0, flags=_POPULATE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return  # someone else removed it, and told the tracker (told twice, it complains)
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

"""Blocks to and from worker processes through shared memory: large buffers are not pickled.

A block pickled the usual way copies every large buffer four times (into the pickle, into the
pipe, out of it, out of the pickle), on both sides of the pipe: for decoded images a fifth of
each worker's time and most of the parent's. Here the sender pickles with protocol 5, keeping
buffers of :data:`OUT_OF_BAND` bytes or more (numpy and Arrow arrays; the ``bytes`` of fetched
samples, lifted by :func:`pack_args`) out of the stream, writes them into one new
shared-memory segment and sends the small rest; the receiver maps the segment and copies each
buffer out once. Two copies in all, no pipe, no pickle of the payload.

Segments are used again: a process keeps the first :data:`KEEP` segments it makes for each
pool mapped, and writes the next block into one its reader has given back, so the kernel
neither clears new pages nor maps them for every block (2 MB of JPEG bytes for a worker:
1.26 ms to pack into a new segment, 0.52 ms into one used again). The first byte
of a kept segment says whether it is free; the last to need the block gives it back: the
parent for a result once it has copied the arrays out, and for a call's arguments once the
call is over or cancelled. Segments beyond those kept are used once, and removed by the
parent then. The pool sweeps its prefix when it shuts down (kept segments included), and the
resource tracker the workers share with the parent removes any left by a process that dies;
when the whole process group is killed at once, the tracker with it, the owner's janitor
(:mod:`.janitor`) removes them.
Space is reserved when a segment is made (``ENOSPC`` then, instead of a ``SIGBUS`` on writing
into a full ``/dev/shm``), and a block goes the usual way when shared memory is missing,
nearly full or not worth it, or when the environment says ``ZEPHON_WORKER_SHM=0``.
"""

from __future__ import annotations

import contextlib
import importlib
import itertools
import mmap
import os
import pickle
import threading
from collections import OrderedDict
from typing import Any

from zephon.engine import janitor

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
KEEP = 6  # segments a process keeps per pool: two pieces in flight per worker, and spare
_HEADER = 64  # a segment's first bytes: its state (below), then the buffers, aligned
_FREE, _BUSY = 0, 1
_SEEN = 32  # other processes' kept segments this process keeps mapped
_lock = threading.Lock()  # the parent packs on the loop and unpacks on the pool's thread
_own: dict[str, list[_Kept]] = {}  # per prefix: kept segments this process made
_seen: OrderedDict[str, mmap.mmap] = OrderedDict()  # kept segments of others, mapped


def _forget_in_child() -> None:
    """In a process forked from this one (a DataLoader worker): the lock may have been held
    by another thread at the fork, and the segments are the parent's to use."""
    global _lock, _own, _seen
    _lock, _own, _seen = threading.Lock(), {}, OrderedDict()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


class _Kept:
    """A segment this process made and keeps mapped for the next block."""

    __slots__ = ("mapped", "name", "size")

    def __init__(self, name: str, size: int, mapped: mmap.mmap) -> None:
        self.name, self.size, self.mapped = name, size, mapped


class Packed:
    """A pickled value and where its large buffers lie: a segment's ``name`` and
    ``(offset, size)`` spans, or the buffers themselves (``inline``). ``kept``: the segment
    is used again once given back (else removed after one use); ``owned``: per span, whether
    the reader must copy it (an array would otherwise stay a view of a segment used again;
    ``bytes`` are copies anyway)."""

    __slots__ = ("data", "inline", "kept", "name", "owned", "spans")

    def __init__(
        self,
        data: bytes,
        name: str | None,
        spans: list[tuple[int, int]],
        inline: list[bytearray],
        kept: bool = False,
        owned: list[bool] | None = None,
    ) -> None:
        self.data, self.name, self.spans, self.inline = data, name, spans, inline
        self.kept, self.owned = kept, owned or []

    def __reduce__(self) -> tuple[Any, ...]:
        return Packed, (self.data, self.name, self.spans, self.inline, self.kept, self.owned)


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
    spans, size = [], _HEADER
    for buffer in big:
        spans.append((size, buffer.raw().nbytes))
        size += -(-buffer.raw().nbytes // _ALIGN) * _ALIGN
    kept = _take(prefix, size) if big and size >= MIN_SEGMENT else None
    once = None if kept or not big or size < MIN_SEGMENT else _segment(prefix, size)
    if kept is not None:
        mapped, name = kept.mapped, kept.name
    elif once is not None:
        mapped, name = _map(once, size), once
    else:
        return Packed(data, None, [], [bytearray(b.raw()) for b in big])
    for buffer, (offset, n) in zip(big, spans, strict=True):
        mapped[offset : offset + n] = buffer.raw()
    if kept is None:
        mapped.close()
    owned = [type(b.raw().obj) is not bytes for b in big]
    return Packed(data, name, spans, [], kept is not None, owned)


def _take(prefix: str, size: int) -> _Kept | None:
    """A kept segment of ``prefix`` of at least ``size`` bytes, marked busy: a free one, or
    a new one while fewer than :data:`KEEP` are kept (``None``: use a segment once)."""
    with _lock:
        segments = _own.setdefault(prefix, [])
        for kept in segments:
            if kept.size >= size and kept.mapped[0] == _FREE:
                kept.mapped[0] = _BUSY
                return kept
        if len(segments) >= KEEP:
            return None
    size = max(MIN_SEGMENT, 1 << (size - 1).bit_length())  # room for the next, larger one
    name = _segment(prefix, size)
    if name is None:
        return None
    kept = _Kept(name, size, _map(name, size))
    kept.mapped[0] = _BUSY
    with _lock:
        _own[prefix].append(kept)
    return kept


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
    mapped = _seen_map(packed.name) if packed.kept else _map(packed.name)
    view = memoryview(mapped)
    owned = packed.owned or [False] * len(packed.spans)
    buffers = [
        bytearray(view[o : o + n]) if own else view[o : o + n]
        for (o, n), own in zip(packed.spans, owned, strict=True)
    ]
    args = pickle.loads(packed.data, buffers=buffers)
    view.release()
    if not packed.kept:
        with contextlib.suppress(BufferError):  # an array argument may still be a view of it
            mapped.close()
    return args  # type: ignore[no-any-return]


def discard(packed: Packed) -> None:
    """Give back (or remove) the segment of a call's arguments once the call is over (or
    never ran)."""
    if packed.name is None:
        return
    if not packed.kept:
        _unlink(packed.name)
        return
    with _lock:
        for kept in _own.get(_prefix_of(packed.name), ()):
            if kept.name == packed.name:
                kept.mapped[0] = _FREE


def _segment(prefix: str, size: int) -> str | None:
    """A new segment of ``size`` bytes, space reserved, or ``None`` if there is no room."""
    if not AVAILABLE or not _room_for(size):
        return None
    name = f"{prefix}{os.getpid():x}_{next(_count):x}"
    if janitor.owned_by(name, os.getpid()):
        janitor.ensure()  # removes it if this process tree is killed outright
    # Told to the tracker before it exists: a kill between the two would otherwise leave a
    # segment nobody knows of (one that never came to be is only a warning at cleanup).
    resource_tracker.register("/" + name, "shared_memory")
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except OSError:  # out of file descriptors, no permission: the pipe still works
        resource_tracker.unregister("/" + name, "shared_memory")
        return None
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
    """The worker's value again, its arrays copied out of the segment, which is then given
    back to the worker (or gone)."""
    if packed.name is None:
        return pickle.loads(packed.data, buffers=packed.inline)
    if packed.kept:
        mapped = _seen_map(packed.name)
    else:
        try:
            mapped = _map(packed.name)
        finally:
            _unlink(packed.name)
    # Copied out at once (one memcpy per array) rather than kept as views: a view would keep
    # its whole block's segment alive for as long as any one item of the block lives on (in a
    # shuffle buffer, say), and items must cost their own size, not their block's.
    with memoryview(mapped) as view:
        buffers = [bytearray(view[o : o + n]) for o, n in packed.spans]
    if packed.kept:
        mapped[0] = _FREE  # the worker may write its next result there
    else:
        mapped.close()
    return pickle.loads(packed.data, buffers=buffers)


def _map(name: str, size: int = 0) -> mmap.mmap:
    """The segment ``name``, mapped, every page at once."""
    fd = _posixshmem.shm_open("/" + name, os.O_RDWR, 0o600)
    try:
        return mmap.mmap(fd, size, flags=_POPULATE)
    finally:
        os.close(fd)


def _seen_map(name: str) -> mmap.mmap:
    """Another process's kept segment ``name``, mapped once and then kept mapped."""
    with _lock:
        mapped = _seen.get(name)
        if mapped is not None:
            _seen.move_to_end(name)
            return mapped
    mapped = _map(name)
    with _lock:
        _seen[name] = mapped
        while len(_seen) > _SEEN:
            with contextlib.suppress(BufferError):
                _seen.popitem(last=False)[1].close()
    return mapped


def _prefix_of(name: str) -> str:
    """The pool prefix of a segment's name (``prefix`` + pid + ``_`` + number)."""
    return name[: name.rindex("_", 0, name.rindex("_")) + 1]


def _unlink(name: str) -> None:
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return  # someone else removed it, and told the tracker (told twice, it complains)
    resource_tracker.unregister("/" + name, "shared_memory")


def sweep(prefix: str) -> int:
    """Unlink segments named ``prefix...`` still in ``/dev/shm`` (the kept ones, and results
    nobody received: a worker killed after writing one), and unmap this process's; how many
    there were."""
    with _lock:
        mappings = [k.mapped for k in _own.pop(prefix, ())]
        mappings += [_seen.pop(n) for n in [n for n in _seen if n.startswith(prefix)]]
    for mapped in mappings:
        with contextlib.suppress(BufferError):  # a view of it lives on: unmapped with it
            mapped.close()
    try:
        names = [n for n in os.listdir(_SHM_DIR) if n.startswith(prefix)]
    except OSError:
        return 0
    for name in names:
        _unlink(name)
    return len(names)

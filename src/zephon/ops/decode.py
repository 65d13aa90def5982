"""decode: fetched bytes become samples, and a lane's reads become whole chunks again.

Requests of a chunk arrive in the order of their first slot, each with its samples in slot
order; the assembler places samples by slot, so a chunk leaves in exact curriculum order no
matter how its reads were coalesced. With ``on_error="skip"`` a sample that fails to decode is
dropped, counted and listed; other samples of the same read survive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np

from zephon.errors import FormatError, ZephonError, redact_uri
from zephon.formats.blob import Blob, Bytes
from zephon.formats.codec import Codec
from zephon.ops.block import ChunkRows
from zephon.refs import Cursor, ShardInfo

__all__ = ["DecodeJob", "SkipLedger", "decode_job"]

Ints = np.ndarray | Sequence[int]  # a request's int64 column, or plain ints
# one read in a chunk being assembled: slots, items, dataset, shard, samples, passes
_Part = tuple[Ints, Sequence[Any], Any, Any, Ints, "Ints | None"]


@dataclass
class SkipLedger:
    """Samples skipped under ``on_error="skip"``, within a budget."""

    budget: int
    skipped: list[tuple[str, str, int, str]] = field(default_factory=list)

    def add(self, dataset: str, uri: str, sample: int, error: str) -> None:
        self.skipped.append((dataset, redact_uri(uri), sample, error))
        if len(self.skipped) > self.budget:
            raise ZephonError(
                f"more than {self.budget} samples failed to decode (skip budget exhausted); "
                f"last: {error}"
            )


@dataclass(slots=True)
class DecodeJob:
    """Everything a worker needs to decode one read: small and picklable."""

    codec: Codec
    shard: ShardInfo
    index: Any
    parts: list[tuple[int, Bytes]]
    samples: Ints  # a request's int64 array, or any ints
    skip: bool
    cache: Any = None  # the run's DiskCache, for codecs that keep decompressed shards

    def __reduce__(self) -> tuple[Any, ...]:
        # Parts may be views of cached reads, which cannot cross processes: send bytes.
        parts = [(at, data if isinstance(data, bytes) else bytes(data)) for at, data in self.parts]
        return (
            DecodeJob,
            (self.codec, self.shard, self.index, parts, self.samples, self.skip, self.cache),
        )


def decode_job(job: DecodeJob) -> tuple[list[Any], list[tuple[int, str]]]:
    """Decode a read; with ``skip``, failures are returned as ``(position, message)``."""
    if job.cache is not None:
        job.codec.use_disk_cache(job.cache)
    blob = Blob(job.parts)
    # Codecs take a list of ints (they index and loop in Python, where numpy scalars are slow)
    # unless they say they work on the array itself.
    samples: Any = job.samples
    if not job.codec.takes_arrays:
        samples = samples.tolist() if isinstance(samples, np.ndarray) else list(samples)
    try:
        return list(job.codec.decode(job.shard, job.index, blob, samples)), []
    except FormatError:
        if not job.skip:
            raise
    items: list[Any] = []
    failed: list[tuple[int, str]] = []
    for pos, sample in enumerate(samples):  # find the bad ones, keep the rest
        try:
            items.extend(job.codec.decode(job.shard, job.index, blob, (sample,)))
        except FormatError as exc:
            items.append(_FAILED)
            failed.append((pos, str(exc)))
    return items, failed


class _Failed:
    __slots__ = ()


_FAILED = _Failed()


def is_failed(item: Any) -> bool:
    return item is _FAILED


class ChunkAssembler:
    """Collects a lane's decoded reads into chunks in slot order.

    ``emit(items, rows, failed, nbytes)`` receives each chunk with its provenance in columns;
    ``failed`` says whether any of its items is a failed placeholder, ``nbytes`` what its
    reads held. A chunk leaves whole,
    unless the reads held exceed ``max_bytes``: then every slot before the newest read's first
    slot is complete (reads come in the order of their first slot), and that prefix leaves
    at once, so large records never hold a whole chunk in memory. The lane's first chunk
    leaves as it completes: each run of slots from its start that its reads filled leaves
    at once, so the first sample waits for the first read, not the whole chunk.
    """

    def __init__(
        self,
        lane: int,
        emit: Callable[[list[Any], ChunkRows, bool, int], Any],
        max_bytes: int = 1 << 62,
    ) -> None:
        self.lane = lane
        self.max_bytes = max_bytes
        self._emit = emit
        self._cursor: Cursor | None = None
        self._parts: list[_Part] = []
        self._failed = False
        self._held = 0
        self._first: tuple[set[int], int] | None = (set(), -1)  # filled slots, next to leave

    def add(
        self,
        cursor: Cursor,
        slots: Ints,
        items: Sequence[Any],
        dataset: int,
        shard: int,
        samples: Ints,
        failed: bool = False,
        nbytes: int = 0,
        passes: Ints | None = None,
    ) -> None:
        """Add one read: ``items`` are samples ``samples`` of ``(dataset, shard)`` at
        ``slots`` of the chunk at ``cursor``, drawn in ``passes`` (``None``: pass 0);
        ``nbytes`` is what it holds."""
        if self._cursor is not None and cursor.chunk != self._cursor.chunk:
            self.flush()
        elif self._held >= self.max_bytes and len(slots):
            self._release(int(slots[0]))
        self._cursor = cursor
        self._parts.append((slots, items, dataset, shard, samples, passes))
        self._failed |= failed
        self._held += nbytes
        if self._first is not None and len(slots):
            self._stream_first(slots)

    @property
    def held(self) -> int:
        """Bytes of the items it holds back, waiting for earlier slots."""
        return self._held

    def _stream_first(self, slots: Ints) -> None:
        """Let the lane's first chunk leave up to its first slot no read has filled (the
        first read holds the lowest slot: the chunk's start, or where a restore resumes)."""
        assert self._first is not None
        filled, at = self._first
        filled.update(np.asarray(slots).tolist())
        start = at = int(slots[0]) if at < 0 else at
        while at in filled:
            at += 1
        self._first = (filled, at)
        if at > start:
            self._release(at)

    def flush(self) -> None:
        """Emit what is held of the current chunk."""
        self._release(None)
        self._cursor, self._parts, self._failed, self._held = None, [], False, 0
        self._first = None

    def _release(self, before: int | None) -> None:
        """Emit the held items at slots below ``before`` (all with ``None``) in slot order;
        the rest stay held."""
        cursor, parts = self._cursor, self._parts
        if cursor is None or not parts:
            return
        if len(parts) == 1 and before is None:  # the common case: nothing to sort
            p_slots, p_items, p_dataset, p_shard, p_samples, passes = parts[0]
            n = len(p_slots)
            slots = np.asarray(p_slots, dtype=np.int64)
            samples = np.asarray(p_samples, dtype=np.int64)
            dataset, shard = _column(p_dataset, n).copy(), _column(p_shard, n).copy()
            items = list(p_items)
        else:
            slots, samples, dataset, shard, passes, items = _in_slot_order(parts)
        nbytes = self._held
        if before is not None:
            cut = int(np.searchsorted(slots, before))
            if cut == 0:
                return
            rest_passes = None if passes is None else passes[cut:]
            rest = (
                slots[cut:],
                items[cut:],
                dataset[cut:],
                shard[cut:],
                samples[cut:],
                rest_passes,
            )
            self._parts = [rest] if len(rest[0]) else []
            self._held = self._held * len(rest[0]) // max(1, len(slots))
            nbytes -= self._held
            slots, samples, dataset, shard = slots[:cut], samples[:cut], dataset[:cut], shard[:cut]
            items = items[:cut]
            passes = None if passes is None else passes[:cut]
        rows = ChunkRows(
            self.lane, cursor, dataset, shard, samples, slots + 1, passes_column(passes)
        )
        self._emit(items, rows, self._failed, nbytes)


def _in_slot_order(
    parts: list[_Part],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, list[Any]]:
    """The parts' columns concatenated and sorted by slot. Each read lists its samples in
    slot order and reads come in the order of their first slot, so the concatenation is
    often in order already (no shuffle, or one read)."""
    lengths = [len(p[0]) for p in parts]
    slots = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts])
    samples = np.concatenate([np.asarray(p[4], dtype=np.int64) for p in parts])
    dataset = np.concatenate(
        [
            np.broadcast_to(np.asarray(p[2], dtype=np.int64), n)
            for p, n in zip(parts, lengths, strict=True)
        ]
    )
    shard = np.concatenate(
        [
            np.broadcast_to(np.asarray(p[3], dtype=np.int64), n)
            for p, n in zip(parts, lengths, strict=True)
        ]
    )
    passes = None
    if any(p[5] is not None for p in parts):
        passes = np.concatenate(
            [_column(0 if p[5] is None else p[5], n) for p, n in zip(parts, lengths, strict=True)]
        )
    items = list(chain.from_iterable(p[1] for p in parts))
    if not bool((slots[1:] > slots[:-1]).all()):
        order = np.argsort(slots, kind="stable")
        slots, samples, dataset, shard = slots[order], samples[order], dataset[order], shard[order]
        passes = None if passes is None else passes[order]
        items = [items[i] for i in order.tolist()]
    return slots, samples, dataset, shard, passes, items


def passes_column(passes: Any) -> np.ndarray | None:
    """A chunk's passes as a column, or ``None`` when every item is in pass 0."""
    if passes is None:
        return None
    column = np.asarray(passes, dtype=np.int64)
    return column if column.any() else None


def _column(value: Any, n: int) -> np.ndarray:
    """``value`` (an int, or already a column) as an int64 column of ``n``."""
    return np.broadcast_to(np.asarray(value, dtype=np.int64), n)

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

from zephon.errors import FormatError, ZephonError
from zephon.formats.blob import Blob, Bytes
from zephon.ops.block import ChunkRows
from zephon.refs import Cursor, ShardInfo

__all__ = ["DecodeJob", "SkipLedger", "decode_job"]

Ints = np.ndarray | Sequence[int]  # a request's int64 column, or plain ints


@dataclass
class SkipLedger:
    """Samples skipped under ``on_error="skip"``, within a budget."""

    budget: int
    skipped: list[tuple[str, str, int, str]] = field(default_factory=list)

    def add(self, dataset: str, uri: str, sample: int, error: str) -> None:
        self.skipped.append((dataset, uri, sample, error))
        if len(self.skipped) > self.budget:
            raise ZephonError(
                f"more than {self.budget} samples failed to decode (skip budget exhausted); "
                f"last: {error}"
            )


@dataclass(slots=True)
class DecodeJob:
    """Everything a worker needs to decode one read: small and picklable."""

    codec: Any
    shard: ShardInfo
    index: Any
    parts: list[tuple[int, Bytes]]
    samples: Ints  # a request's int64 array, or any ints
    skip: bool

    def __reduce__(self) -> tuple[Any, ...]:
        # Parts may be views of cached reads, which cannot cross processes: send bytes.
        parts = [(at, data if isinstance(data, bytes) else bytes(data)) for at, data in self.parts]
        return (DecodeJob, (self.codec, self.shard, self.index, parts, self.samples, self.skip))


def decode_job(job: DecodeJob) -> tuple[list[Any], list[tuple[int, str]]]:
    """Decode a read; with ``skip``, failures are returned as ``(position, message)``."""
    blob = Blob(job.parts)
    # Codecs take a list of ints (they index and loop in Python, where numpy scalars are slow)
    # unless they say they work on the array itself.
    samples: Any = job.samples
    if not getattr(job.codec, "takes_arrays", False):
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

    ``emit(items, rows, failed)`` receives each whole chunk with its provenance in columns;
    ``failed`` says whether any of its items is a failed placeholder.
    """

    def __init__(self, lane: int, emit: Callable[[list[Any], ChunkRows, bool], Any]):
        self.lane = lane
        self._emit = emit
        self._cursor: Cursor | None = None
        self._parts: list[tuple[Ints, Sequence[Any], int, int, Ints]] = []
        self._failed = False

    def add(
        self,
        cursor: Cursor,
        slots: Ints,
        items: Sequence[Any],
        dataset: int,
        shard: int,
        samples: Ints,
        failed: bool = False,
    ) -> Any:
        """Add one read: ``items`` are samples ``samples`` of ``(dataset, shard)`` at
        ``slots`` of the chunk at ``cursor``."""
        out = None
        if self._cursor is not None and cursor.chunk != self._cursor.chunk:
            out = self.flush()
        self._cursor = cursor
        self._parts.append((slots, items, dataset, shard, samples))
        self._failed |= failed
        return out

    def flush(self) -> Any:
        cursor, parts, failed = self._cursor, self._parts, self._failed
        self._cursor, self._parts, self._failed = None, [], False
        if cursor is None or not parts:
            return None
        # Each read lists its samples in slot order; reads come in the order of their first
        # slot. Concatenated, they are often in order already (no shuffle, or one read).
        if len(parts) == 1:
            p_slots, p_items, p_dataset, p_shard, p_samples = parts[0]
            n = len(p_slots)
            slots = np.asarray(p_slots, dtype=np.int64)
            samples = np.asarray(p_samples, dtype=np.int64)
            dataset = np.full(n, p_dataset, dtype=np.int64)
            shard = np.full(n, p_shard, dtype=np.int64)
            items = list(p_items)
        else:
            lengths = [len(p[0]) for p in parts]
            slots = np.concatenate([np.asarray(p[0], dtype=np.int64) for p in parts])
            samples = np.concatenate([np.asarray(p[4], dtype=np.int64) for p in parts])
            dataset = np.repeat(np.array([p[2] for p in parts], dtype=np.int64), lengths)
            shard = np.repeat(np.array([p[3] for p in parts], dtype=np.int64), lengths)
            items = list(chain.from_iterable(p[1] for p in parts))
            if not bool((slots[1:] > slots[:-1]).all()):
                order = np.argsort(slots, kind="stable")
                slots, samples, dataset, shard = (
                    slots[order],
                    samples[order],
                    dataset[order],
                    shard[order],
                )
                items = [items[i] for i in order.tolist()]
        rows = ChunkRows(self.lane, cursor, dataset, shard, samples, slots + 1)
        return self._emit(items, rows, failed)

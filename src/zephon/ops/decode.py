"""decode: fetched bytes become samples, and a lane's reads become whole chunks again.

Requests of a chunk arrive in the order of their first slot, each with its samples in slot
order; the assembler places samples by slot, so a chunk leaves in exact curriculum order no
matter how its reads were coalesced. With ``on_error="skip"`` a sample that fails to decode is
dropped, counted and listed; other samples of the same read survive.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon.errors import FormatError, ZephonError
from zephon.formats.blob import Blob
from zephon.refs import Cursor, ShardInfo

__all__ = ["DecodeJob", "SkipLedger", "decode_job"]


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
    parts: list[tuple[int, bytes]]
    samples: tuple[int, ...]
    skip: bool


def decode_job(job: DecodeJob) -> tuple[list[Any], list[tuple[int, str]]]:
    """Decode a read; with ``skip``, failures are returned as ``(position, message)``."""
    blob = Blob(job.parts)
    try:
        return list(job.codec.decode(job.shard, job.index, blob, job.samples)), []
    except FormatError:
        if not job.skip:
            raise
    items: list[Any] = []
    failed: list[tuple[int, str]] = []
    for pos, sample in enumerate(job.samples):  # find the bad ones, keep the rest
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
    """Collects a lane's decoded reads into chunks in slot order."""

    def __init__(self, lane: int, emit: Callable[[Cursor, list[Any], list[Any], list[int]], Any]):
        self.lane = lane
        self._emit = emit
        self._cursor: Cursor | None = None
        self._slots: dict[int, tuple[Any, Any]] = {}

    def add(
        self, cursor: Cursor, slots: Sequence[int], items: Sequence[Any], refs: Sequence[Any]
    ) -> Any:
        out = None
        if self._cursor is not None and cursor.chunk != self._cursor.chunk:
            out = self.flush()
        self._cursor = cursor
        for slot, item, ref in zip(slots, items, refs, strict=True):
            self._slots[slot] = (item, ref)
        return out

    def flush(self) -> Any:
        if self._cursor is None or not self._slots:
            self._cursor = None
            return None
        order = sorted(self._slots)
        items = [self._slots[s][0] for s in order]
        refs = [self._slots[s][1] for s in order]
        cursor = self._cursor
        self._cursor, self._slots = None, {}
        return self._emit(cursor, items, refs, order)

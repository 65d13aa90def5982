"""Blocks: what flows between stages. asyncio overhead is paid per block, never per sample.

A block from decode carries its provenance in columns (:class:`ChunkRows`); the per-item
``refs`` and ``marks`` lists are built only if an operator asks for them, so a plain
decode -> merge -> consumer path allocates no tuple per sample.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from zephon.refs import Cursor

__all__ = ["Block", "ChunkRows", "Mark", "Provenance", "SampleRef", "ref_at"]

SampleRef = tuple[int, int, int]  # (dataset, shard, sample): where an item came from
# A lane position: (lane, chunk cursor or None at the lane's start, pointers of that chunk
# delivered, states of the stateful ops (shuffle, pack, apply) in order: what they must skip,
# or a custom op's {"state": ...}).
Mark = tuple[int, Cursor | None, int, tuple[Any, ...]]


@dataclass(frozen=True, slots=True, eq=False)
class ChunkRows:
    """Provenance of a run of items from one chunk of one lane, one array entry per item:
    item ``i`` is sample ``(dataset[i], shard[i], sample[i])`` and, once received, leaves the
    lane at ``(lane, cursor, delivered[i], ())``."""

    lane: int
    cursor: Cursor
    dataset: np.ndarray
    shard: np.ndarray
    sample: np.ndarray
    delivered: np.ndarray

    def refs(self) -> list[Any]:
        columns = (self.dataset.tolist(), self.shard.tolist(), self.sample.tolist())
        return list(zip(*columns, strict=True))

    def marks(self) -> list[Any]:
        lane, cursor = repeat(self.lane), repeat(self.cursor)
        return list(zip(lane, cursor, self.delivered.tolist(), repeat(())))

    def mark(self, i: int) -> Mark:
        return (self.lane, self.cursor, int(self.delivered[i]), ())

    def ref(self, i: int) -> SampleRef:
        return (int(self.dataset[i]), int(self.shard[i]), int(self.sample[i]))


Provenance = list[Any] | ChunkRows  # a block's refs, as a list or in columns


def ref_at(provenance: Provenance, i: int) -> Any:
    """The ref of item ``i``."""
    return provenance.ref(i) if isinstance(provenance, ChunkRows) else provenance[i]


class Block:
    """Items of one lane (``lane >= 0``) or of several (``-1``, after merge), in order, with
    per-item provenance.

    Attributes:
        lane: the lane the items belong to.
        items: samples, or batches after ``batch``.
        refs: per item, its source sample (a list of them for a batch).
        marks: per item, the lane position just after it: what a checkpoint taken right after
            the consumer received the item records.
        nbytes: fetched bytes this block holds (for the fetch budget).
    """

    __slots__ = ("_marks", "_refs", "_rows", "extra", "items", "lane", "nbytes")

    def __init__(
        self,
        lane: int,
        items: list[Any],
        refs: list[Any] | None = None,
        marks: list[Mark] | None = None,
        nbytes: int = 0,
        extra: dict[str, Any] | None = None,
        *,
        rows: ChunkRows | None = None,
    ) -> None:
        if rows is None and (refs is None or marks is None):
            raise TypeError("a Block needs refs and marks, or rows")
        self.lane = lane
        self.items = items
        self._refs = refs
        self._marks = marks
        self._rows = rows
        self.nbytes = nbytes
        self.extra: dict[str, Any] = {} if extra is None else extra

    @property
    def refs(self) -> list[Any]:
        if self._refs is None:
            assert self._rows is not None
            self._refs = self._rows.refs()
        return self._refs

    @property
    def marks(self) -> list[Mark]:
        if self._marks is None:
            assert self._rows is not None
            self._marks = self._rows.marks()
        return self._marks

    def mark(self, i: int) -> Mark:
        """The mark of item ``i``, without building the list of them."""
        if self._marks is None and self._rows is not None:
            return self._rows.mark(i)
        return self.marks[i]

    def provenance(self) -> Provenance:
        """The refs in whichever form the block holds them (cheap to send to a worker)."""
        return self._refs if self._refs is not None else self._rows  # type: ignore[return-value]

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Block(lane={self.lane}, items={len(self.items)})"

    def replace(self, items: list[Any], refs: list[Any], marks: list[Mark]) -> Block:
        return Block(self.lane, items, refs, marks, self.nbytes, self.extra)

    def with_extra(self, **extra: Any) -> Block:
        """The same block with ``extra`` entries added (the original is left as it is)."""
        return Block(self.lane, self.items, self._refs, self._marks, self.nbytes,
                     {**self.extra, **extra}, rows=self._rows)  # fmt: skip

    def with_items(self, items: list[Any]) -> Block:
        """The same provenance for new items, one for one (a map)."""
        return Block(self.lane, items, self._refs, self._marks, self.nbytes, self.extra,
                     rows=self._rows)  # fmt: skip

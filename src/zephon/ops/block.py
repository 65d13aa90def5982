"""Blocks: what flows between stages. asyncio overhead is paid per block, never per sample."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zephon.refs import Cursor

__all__ = ["Block", "Mark", "SampleRef"]

SampleRef = tuple[int, int, int]  # (dataset, shard, sample): where an item came from
# A lane position: (lane, chunk cursor or None at the lane's start, pointers of that chunk
# delivered, states of the stateful ops (shuffle, pack) in order: what they must skip).
Mark = tuple[int, Cursor | None, int, tuple[int, ...]]


@dataclass(slots=True)
class Block:
    """Items of one lane, in order, with per-item provenance.

    Attributes:
        lane: the lane the items belong to.
        items: samples, or batches after ``batch``.
        refs: per item, its source sample (a list of them for a batch).
        marks: per item, the lane position just after it: what a checkpoint taken right after
            the consumer received the item records.
        nbytes: fetched bytes this block holds (for the fetch budget).
    """

    lane: int
    items: list[Any]
    refs: list[Any]
    marks: list[Mark]
    nbytes: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)

    def replace(self, items: list[Any], refs: list[Any], marks: list[Mark]) -> Block:
        return Block(self.lane, items, refs, marks, self.nbytes, self.extra)

"""Blocks: what flows between stages. asyncio overhead is paid per block, never per sample.

A block from decode carries its provenance in columns (:class:`ChunkRows`); the per-item
``refs`` and ``marks`` lists are built only if an operator asks for them, so a plain
decode -> merge -> consumer path allocates no tuple per sample.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass
from itertools import repeat
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.ops.marks import Mark, Position, lane_of, with_state
from zephon.refs import Cursor

__all__ = [
    "Block",
    "ChunkRows",
    "Interleaved",
    "Provenance",
    "SampleRef",
    "WindowRows",
    "dataset_of",
    "ref_at",
]

# (dataset, shard, sample, pass): where an item came from, and in which pass of its dataset
SampleRef = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True, eq=False)
class ChunkRows:
    """Provenance of a run of items from one chunk of one lane, one array entry per item:
    item ``i`` is sample ``(dataset[i], shard[i], sample[i])`` drawn in pass ``passes[i]``
    (all 0 if ``None``) and, once received, leaves the lane at
    ``(lane, cursor, delivered[i], (), None)``."""

    lane: int
    cursor: Cursor
    dataset: np.ndarray
    shard: np.ndarray
    sample: np.ndarray
    delivered: np.ndarray
    passes: np.ndarray | None = None

    def refs(self) -> list[Any]:
        columns = (self.dataset.tolist(), self.shard.tolist(), self.sample.tolist())
        if self.passes is None:
            return list(zip(*columns, repeat(0), strict=False))  # repeat(0) never ends
        return list(zip(*columns, self.passes.tolist(), strict=True))

    def marks(self) -> list[Any]:
        lane, cursor = repeat(self.lane), repeat(self.cursor)
        return list(zip(lane, cursor, self.delivered.tolist(), repeat(()), repeat(None)))

    def mark(self, i: int) -> Mark:
        return (self.lane, self.cursor, int(self.delivered[i]), (), None)

    def ref(self, i: int) -> SampleRef:
        pass_ = 0 if self.passes is None else int(self.passes[i])
        return (int(self.dataset[i]), int(self.shard[i]), int(self.sample[i]), pass_)

    def slice(self, at: int, end: int) -> ChunkRows:
        passes = None if self.passes is None else self.passes[at:end]
        return ChunkRows(
            self.lane,
            self.cursor,
            self.dataset[at:end],
            self.shard[at:end],
            self.sample[at:end],
            self.delivered[at:end],
            passes,
        )


@dataclass(frozen=True, slots=True, eq=False)
class WindowRows:
    """Provenance of outputs ``first, first + 1, ...`` of one window of a windowed step
    (shuffle, pack): their refs as a list, their marks computed. Output ``j`` leaves the lane
    at ``before`` with the step's state ``j + 1`` appended (``{"skip": j + 1, **tag}`` when the
    window has a ``tag``: its part of a lane's first window, the settings it was restored
    from) and high water ``hw``. No tuple per item: a mark holds a chunk's ``Cursor``, which
    the garbage collector must then track, and windows buffered ahead made full collections
    frequent enough to hold up a consumer."""

    before: Mark
    hw: Position
    tag: dict[str, Any] | None
    first: int
    refs_list: list[Any]

    def refs(self) -> list[Any]:
        return self.refs_list

    def ref(self, i: int) -> Any:
        return self.refs_list[i]

    def mark(self, i: int) -> Mark:
        s = self.first + i + 1
        state = s if self.tag is None else {"skip": s, **self.tag}
        return with_state(self.before, state, self.hw)

    def marks(self) -> list[Any]:
        return [self.mark(i) for i in range(len(self.refs_list))]

    def slice(self, at: int, end: int) -> WindowRows:
        return WindowRows(self.before, self.hw, self.tag, self.first + at, self.refs_list[at:end])


class Interleaved:
    """Provenance of a merged block: runs of lane blocks interleaved round-robin.

    Each segment ``(sources, take)`` holds ``len(sources) * take`` items: step ``t`` takes
    item ``offset + t`` of each ``(block, offset)`` source in turn. What the consumer has
    received of a lane is then arithmetic, with no tuple per item.
    """

    __slots__ = ("_segments", "_starts", "size")

    def __init__(self) -> None:
        self._segments: list[tuple[list[tuple[Block, int]], int]] = []
        self._starts: list[int] = []
        self.size = 0

    def add(self, sources: list[tuple[Block, int]], take: int) -> None:
        self._segments.append((sources, take))
        self._starts.append(self.size)
        self.size += len(sources) * take

    def _locate(self, i: int) -> tuple[Block, int]:
        s = bisect_right(self._starts, i) - 1
        sources, _ = self._segments[s]
        step, k = divmod(i - self._starts[s], len(sources))
        block, offset = sources[k]
        return block, offset + step

    def mark(self, i: int) -> Mark:
        block, j = self._locate(i)
        return block.mark(j)

    def refs(self) -> list[Any]:
        return [ref_at(b.provenance(), j) for b, j in map(self._locate, range(self.size))]

    def marks(self) -> list[Any]:
        return [self.mark(i) for i in range(self.size)]

    def progress(self, lo: int, hi: int) -> dict[int, tuple[int, Mark]]:
        """Per lane, how many of items ``[lo, hi)`` are its and the mark of its last one."""
        out: dict[int, tuple[int, Mark]] = {}
        first = max(0, bisect_right(self._starts, lo) - 1)
        for s in range(first, len(self._segments)):
            start = self._starts[s]
            if start >= hi:
                break
            sources, take = self._segments[s]
            n = len(sources)
            a, b = max(lo, start) - start, min(hi, start + n * take) - start
            for k, (block, offset) in enumerate(sources):
                upto = -(-(b - k) // n)  # steps of source k before local position b
                count = upto - -(-(a - k) // n)
                if count > 0:
                    had = out.get(block.lane, (0, None))[0]
                    out[block.lane] = (had + count, block.mark(offset + upto - 1))
        return out


Provenance = list[Any] | ChunkRows  # a block's refs, as a list or in columns


def ref_at(provenance: Provenance, i: int) -> Any:
    """The ref of item ``i``."""
    return provenance.ref(i) if isinstance(provenance, ChunkRows) else provenance[i]


def dataset_of(ref: Any, step: str) -> int:
    """The dataset an item came from, for ``step`` (named in the error): an item that
    combines samples (a packed row, a batch) has none."""
    if isinstance(ref, tuple) and len(ref) == 4:
        return int(ref[0])
    raise ConfigError(
        f"{step} needs samples from one dataset each; put it before steps that combine "
        "samples (pack, batch)"
    )


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
        rows: ChunkRows | WindowRows | Interleaved | None = None,
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
        if self._refs is None and isinstance(self._rows, ChunkRows):
            return self._rows
        return self.refs

    def progress(self, lo: int, hi: int) -> dict[int, tuple[int, Mark]]:
        """Per lane, how many of items ``[lo, hi)`` belong to it and the mark of its last
        one: what a consumer that received them has moved each lane on by."""
        if self._marks is None and isinstance(self._rows, Interleaved):
            return self._rows.progress(lo, hi)
        if self._marks is None and isinstance(self._rows, WindowRows):
            return {lane_of(self._rows.before): (hi - lo, self.mark(hi - 1))} if hi > lo else {}
        out: dict[int, tuple[int, Mark]] = {}
        for mark in self.marks[lo:hi]:
            lane = lane_of(mark)
            out[lane] = (out.get(lane, (0, mark))[0] + 1, mark)
        return out

    def __len__(self) -> int:
        return len(self.items)

    def __repr__(self) -> str:
        return f"Block(lane={self.lane}, items={len(self.items)})"

    def replace(self, items: list[Any], refs: list[Any], marks: list[Mark]) -> Block:
        return Block(self.lane, items, refs, marks, self.nbytes, self.extra)

    def with_extra(self, **extra: Any) -> Block:
        """The same block with ``extra`` entries added (the original is left as it is)."""
        return Block(
            self.lane,
            self.items,
            self._refs,
            self._marks,
            self.nbytes,
            {**self.extra, **extra},
            rows=self._rows,
        )

    def split(self, count: int) -> list[Block]:
        """The block cut into up to ``count`` consecutive blocks of about equal length:
        fetched bytes shared in proportion, ``extra`` (a lane position after the last item)
        kept by the last."""
        n = len(self.items)
        if count <= 1 or n <= 1:
            return [self]
        step = -(-n // min(count, n))
        return [self._slice(at, min(n, at + step)) for at in range(0, n, step)]

    def cut(self, n: int) -> tuple[Block, Block]:
        """(the first ``n`` items, the rest) as two blocks, as :meth:`split` cuts them."""
        return self._slice(0, n), self._slice(n, len(self.items))

    def _slice(self, at: int, end: int) -> Block:
        n = len(self.items)
        nbytes = self.nbytes * end // n - self.nbytes * at // n
        extra = self.extra if end == n else {}
        rows = (
            self._rows
            if isinstance(self._rows, ChunkRows | WindowRows) and self._refs is None
            else None
        )
        if rows is not None:
            part = rows.slice(at, end)
            return Block(self.lane, self.items[at:end], nbytes=nbytes, extra=extra, rows=part)
        return Block(
            self.lane, self.items[at:end], self.refs[at:end], self.marks[at:end], nbytes, extra
        )

    def kept(self, keep: list[bool], items: list[Any]) -> Block:
        """The block with only the items ``keep`` marks, ``items`` their new values (a map
        or filter that dropped some); an emptied block still moves its lane on."""
        if all(keep):
            return self.with_items(items)
        refs = [r for r, k in zip(self.refs, keep, strict=True) if k]
        marks = [m for m, k in zip(self.marks, keep, strict=True) if k]
        out = Block(self.lane, items, refs, marks, self.nbytes, dict(self.extra))
        if not items and self.marks:
            out.extra["last_mark"] = self.marks[-1]
        return out

    def with_items(self, items: list[Any]) -> Block:
        """The same provenance for new items, one for one (a map)."""
        return Block(
            self.lane, items, self._refs, self._marks, self.nbytes, self.extra, rows=self._rows
        )

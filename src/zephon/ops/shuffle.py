"""shuffle: a lane's items permuted within consecutive windows of ``buffer_size``.

Each window's permutation is keyed by (seed, lane, where the window starts in the lane), so
it is a pure function of the stream. That is what makes it resumable without saving buffered
items or an RNG: an item's mark is *the mark just before its window* plus how many items of
the window were emitted through it; restoring replays the window from its start and skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from zephon.ops.block import Block, Mark
from zephon.plan.permute import key_of, permute

__all__ = ["shuffle_blocks"]


def start_mark(lane: int, depth: int) -> Mark:
    """The mark of "nothing consumed yet" in a lane, for an op with ``depth`` stateful ops
    before it."""
    return (lane, None, 0, (0,) * depth)


async def shuffle_blocks(
    blocks: AsyncIterator[Block],
    size: int,
    seed: int,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
) -> AsyncIterator[Block]:
    """Windows of ``size`` items, each emitted in a keyed permutation (see module doc).

    ``depth``: stateful ops before this one (the length of incoming marks' op states).
    ``resume``: (the mark before the window to replay, items of it already emitted).
    """
    before, skip = resume if resume is not None else (start_mark(lane, depth), 0)
    items: list[Any] = []
    refs: list[Any] = []
    marks: list[Mark] = []

    def emit() -> Block:
        nonlocal before, skip, items, refs, marks
        n = len(items)
        order = permute(np.arange(n), n, key_of("shuffle", seed, lane, repr(before[1:3]),
                                                before[3])).tolist()  # fmt: skip
        lane_, cursor, delivered, ops = before
        out_marks = [(lane_, cursor, delivered, (*ops, j + 1)) for j in range(n)]
        block = Block(
            lane,
            [items[i] for i in order][skip:],
            [refs[i] for i in order][skip:],
            out_marks[skip:],
        )
        before, skip = marks[-1], 0
        items, refs, marks = [], [], []
        return block

    async for block in blocks:
        out: list[Block] = []
        for item, ref, mark in zip(block.items, block.refs, block.marks, strict=True):
            items.append(item)
            refs.append(ref)
            marks.append(mark)
            if len(items) == size:
                out.append(emit())
        for b in out:
            if b.items:
                yield b
    if items:
        last = emit()
        if last.items:
            yield last

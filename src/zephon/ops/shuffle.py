"""shuffle: a lane's items permuted within consecutive windows of ``buffer_size``.

Each window's permutation is keyed by (seed, lane, where the window starts in the lane), so
it is a pure function of the stream. That is what makes it resumable without saving buffered
items or an RNG: an item's mark is *the mark just before its window* plus how many items of
the window were emitted through it; restoring replays the window from its start and skips.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from zephon.ops.block import Block, Mark, high_water
from zephon.plan.permute import key_of, permute

__all__ = ["shuffle_blocks", "start_mark", "windowed"]


def start_mark(lane: int, depth: int) -> Mark:
    """The mark of "nothing consumed yet" in a lane, for an op with ``depth`` stateful ops
    before it."""
    return (lane, None, 0, (0,) * depth, None)


Window = Callable[[Mark, list[Any], list[Any]], tuple[list[Any], list[Any]]]


async def windowed(
    blocks: AsyncIterator[Block],
    size: int,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
    transform: Window,
) -> AsyncIterator[Block]:
    """Cut a lane's items into windows of ``size`` and emit ``transform(mark before the
    window, items, refs)`` for each, with window-relative marks: output ``j`` of a window is
    marked (mark before the window, ``j + 1``), its high water the window's last input's.
    ``resume`` = (that mark, outputs to skip)."""
    before, skip = resume if resume is not None else (start_mark(lane, depth), 0)
    items: list[Any] = []
    refs: list[Any] = []
    marks: list[Mark] = []

    def emit() -> Block:
        nonlocal before, skip, items, refs, marks
        out, out_refs = transform(before, items, refs)
        lane_, cursor, delivered, ops, _ = before
        hw = high_water(marks[-1])
        out_marks: list[Mark] = [(lane_, cursor, delivered, (*ops, j + 1), hw)
                                 for j in range(len(out))]  # fmt: skip
        block = Block(lane, out[skip:], out_refs[skip:], out_marks[skip:])
        before, skip = marks[-1], 0
        items, refs, marks = [], [], []
        return block

    async for block in blocks:
        ready: list[Block] = []
        for item, ref, mark in zip(block.items, block.refs, block.marks, strict=True):
            items.append(item)
            refs.append(ref)
            marks.append(mark)
            if len(items) == size:
                ready.append(emit())
        for b in ready:
            if b.items:
                yield b
    if items:
        last = emit()
        if last.items:
            yield last


def shuffle_blocks(
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

    def permuted(before: Mark, items: list[Any], refs: list[Any]) -> tuple[list[Any], list[Any]]:
        n = len(items)
        key = key_of("shuffle", seed, lane, repr(before[1:3]), before[3])
        order = permute(np.arange(n), n, key).tolist()
        return [items[i] for i in order], [refs[i] for i in order]

    return windowed(blocks, size, lane, depth, resume, permuted)

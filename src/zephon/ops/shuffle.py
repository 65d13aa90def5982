"""shuffle: a lane's items permuted within consecutive windows of ``buffer_size``.

Each window's permutation is keyed by (seed, lane, where the window starts in the lane), so
it is a pure function of the stream. That is what makes it resumable without saving buffered
items or an RNG: an item's mark is *the mark just before its window* plus how many items of
the window were emitted through it; restoring replays the window from its start and skips.

A fast start: a lane's first window is emitted in parts of growing size (``warmup`` items,
then ``warmup`` more, then twice as many each time, the last part ending where the window
does), so the first items leave after ``warmup`` inputs rather than a whole window. Windows
stay aligned: the first ``size`` outputs are a permutation of the first ``size`` inputs. An
item of a part is marked ``{"skip": j + 1, "part": k}`` (a whole window's, ``j + 1``), so a
restore replays the very part.

A window's order is the permutation of its full capacity (``size``, or the part's) with the
positions it lacks left out (only the stream's last window can lack any). So the items a
restore will skip are known before the window is read again: :func:`replay_skips`. The lane
marks them (:data:`REPLAYED`) and the tokenize steps between it and the shuffle pass them by:
a restore tokenizes what it will deliver, not the part of the window already delivered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from zephon.ops.block import Block, WindowRows
from zephon.ops.marks import Mark, high_water, op_states, position_of, start_mark
from zephon.plan.permute import key_of, permute

__all__ = ["REPLAYED", "first_parts", "replay_skips", "shuffle_blocks", "windowed"]


class _Replayed:
    """An item a restored window will skip, standing in for it (never delivered)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "REPLAYED"

    def __reduce__(self) -> str:
        return "REPLAYED"


REPLAYED = _Replayed()


def first_parts(size: int, warmup: int) -> tuple[int, ...]:
    """Where the parts of a lane's first window end: ``warmup``, doubling, then ``size``;
    ``()`` (one whole window) unless ``0 < warmup < size``."""
    if not 0 < warmup < size:
        return ()
    ends = []
    end = warmup
    while end < size:
        ends.append(end)
        end *= 2
    return (*ends, size)


def _parse(state: Any, parts: tuple[int, ...]) -> tuple[int, int | None]:
    """(outputs to skip, part of the first window or None) from a mark's state."""
    if isinstance(state, dict):
        return int(state["skip"]), int(state["part"])
    return int(state), (0 if parts and state == 0 else None)  # 0: the lane's start


Window = Callable[[Mark, list[Any], list[Any], int], tuple[list[Any], list[Any]]]


async def windowed(
    blocks: AsyncIterator[Block],
    size: int,
    lane: int,
    depth: int,
    resume: tuple[Mark, Any] | None,
    transform: Window,
    parts: tuple[int, ...] = (),
) -> AsyncIterator[Block]:
    """Cut a lane's items into windows of ``size`` and emit ``transform(mark before the
    window, items, refs, its capacity)`` for each, with window-relative marks: output ``j`` is
    marked (mark before the window, ``j + 1``), its high water the window's last input's.
    ``parts``: where the parts of the lane's first window end (:func:`first_parts`); output
    ``j`` of part ``k`` is marked ``{"skip": j + 1, "part": k}``.
    ``resume`` = (that mark, the state in it: what to skip, and which part)."""
    before, state = resume if resume is not None else (start_mark(lane, depth), 0)
    skip, part = _parse(state, parts)
    items: list[Any] = []
    refs: list[Any] = []
    held = 0.0  # the window's items' fetched bytes (channels weigh blocks by them)
    last: Mark = before  # the mark of the window's last input so far

    def capacity() -> int:
        return size if part is None else parts[part] - (parts[part - 1] if part else 0)

    def emit() -> Block:
        nonlocal before, skip, items, refs, part, held
        out, out_refs = transform(before, items, refs, capacity())
        if any(x is REPLAYED for x in out[skip:]):  # the skips were computed for this window
            raise RuntimeError("shuffle: a restored window would deliver a skipped item")
        rows = WindowRows(before, high_water(last), part, skip, out_refs[skip:])
        block = Block(lane, out[skip:], nbytes=int(held * (len(out) - skip) / max(1, len(out))),
                      rows=rows)  # fmt: skip
        before, skip = last, 0
        items, refs, held = [], [], 0.0
        if part is not None:
            part = part + 1 if part + 1 < len(parts) else None
        return block

    room = capacity()
    async for block in blocks:
        ready: list[Block] = []
        n, at = len(block.items), 0
        block_refs, per_item = block.refs, block.nbytes / max(1, n)
        while at < n:
            take = min(room - len(items), n - at)
            items += block.items[at : at + take]
            refs += block_refs[at : at + take]
            held += per_item * take
            at += take
            last = block.mark(at - 1)
            if len(items) == room:
                ready.append(emit())
                room = capacity()
        for b in ready:
            if b.items:
                yield b
    if items and (final := emit()).items:
        yield final


def shuffle_blocks(
    blocks: AsyncIterator[Block],
    size: int,
    seed: int,
    lane: int,
    depth: int,
    resume: tuple[Mark, Any] | None,
    warmup: int = 0,
) -> AsyncIterator[Block]:
    """Windows of ``size`` items, each emitted in a keyed permutation (see module doc).

    ``depth``: stateful ops before this one (the length of incoming marks' op states).
    ``resume``: (the mark before the window to replay, its state: items of it emitted).
    ``warmup``: the first part of the lane's first window (0: no parts).
    """

    def permuted(
        before: Mark, items: list[Any], refs: list[Any], capacity: int
    ) -> tuple[list[Any], list[Any]]:
        order = _order(seed, lane, before, capacity, len(items)).tolist()
        return [items[i] for i in order], [refs[i] for i in order]

    return windowed(blocks, size, lane, depth, resume, permuted, first_parts(size, warmup))


def _order(seed: int, lane: int, before: Mark, capacity: int, n: int) -> np.ndarray:
    """The window's order: its capacity's keyed permutation without the positions >= ``n``."""
    key = key_of("shuffle", seed, lane, repr(position_of(before)), op_states(before))
    order = permute(np.arange(capacity), capacity, key)
    return order if n == capacity else order[order < n]


def replay_skips(
    size: int, seed: int, warmup: int, lane: int, resume: tuple[Mark, Any]
) -> np.ndarray:
    """Positions (from the resumed window's start, ascending) of the items the restored
    shuffle will skip, whatever the window's length turns out to be: the first ``skip`` of
    the full window's order. (A shorter window skips the first ``skip`` of those that exist,
    which include every one of these that exists.)"""
    before, state = resume
    parts = first_parts(size, warmup)
    skip, part = _parse(state, parts)
    capacity = size if part is None else parts[part] - (parts[part - 1] if part else 0)
    if skip == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(_order(seed, lane, before, capacity, capacity)[:skip])

"""Windows of a lane's items: what shuffle and the fit packers share.

:func:`windowed` cuts a lane's items into windows and marks each output relative to the
mark just before its window, so a restore replays the window and skips what was delivered.
A lane's first window may leave in parts of growing size (:func:`first_parts`). Items a
restored window will skip are known beforehand for a shuffle; the lane marks them with
:data:`REPLAYED` so that steps between it and the shuffle pass them by.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

from zephon.ops.block import Block, WindowRows
from zephon.ops.marks import Mark, high_water, start_mark
from zephon.ops.operator import is_count

__all__ = ["REPLAYED", "Window", "check_state", "first_parts", "parse_state", "windowed"]


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


def parse_state(state: Any, parts: tuple[int, ...]) -> tuple[int, int | None, list[Any]]:
    """(outputs to skip, part of the first window or None, the settings the window was
    restored from) from a mark's state. ``layers``: a window begun under other settings
    (see :meth:`zephon.ops.operator.Operator.adapt`), oldest first, each those settings and
    how many outputs they had delivered."""
    if isinstance(state, dict):
        part = state.get("part")
        return int(state["skip"]), (None if part is None else int(part)), state.get("layers", [])
    return int(state), (0 if parts and state == 0 else None), []  # 0: the lane's start


def check_state(state: Any, parts: tuple[int, ...]) -> None:
    """Refuse what :func:`windowed` never writes: a count, ``{"skip": n, "part": k}`` with a
    part of the lane's first window, or ``{"skip": n, "layers": [...]}``.

    Raises:
        ValueError: saying what it should be.
    """
    if is_count(state):
        return
    if not isinstance(state, dict) or not is_count(state.get("skip")):
        raise ValueError('a window state: a count or {"skip": n, ...}')
    if set(state) - {"skip", "part", "layers"}:
        raise ValueError(f"a window state has no {sorted(set(state) - {'skip', 'part', 'layers'})}")
    if "part" in state and not (is_count(state["part"]) and state["part"] < len(parts)):
        raise ValueError(f"part: one of the {len(parts)} parts of the first window")
    layers = state.get("layers", [])
    if not isinstance(layers, list) or not all(
        isinstance(x, dict)
        and x.keys() == {"seq_len", "window", "skip"}
        and all(is_count(v) for v in x.values())
        and x["seq_len"] > 0
        and x["window"] > 0
        for x in layers
    ):
        raise ValueError("layers: the settings a window began under, with their skips")


Window = Callable[[Mark, list[Any], list[Any], int, list[Any]], tuple[list[Any], list[Any]]]


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
    window, items, refs, its capacity, layers)`` for each, with window-relative marks: output
    ``j`` is marked (mark before the window, ``j + 1``), its high water the window's last
    input's. ``parts``: where the parts of the lane's first window end (:func:`first_parts`);
    output ``j`` of part ``k`` is marked ``{"skip": j + 1, "part": k}``.
    ``resume`` = (that mark, the state in it: what to skip, which part, and the ``layers``
    of a window restored under other settings: that window has the first layer's size and
    its outputs are marked ``{"skip": j + 1, "layers": layers}``)."""
    before, state = resume if resume is not None else (start_mark(lane, depth), 0)
    skip, part, layers = parse_state(state, parts)
    items: list[Any] = []
    refs: list[Any] = []
    held = 0.0  # the window's items' fetched bytes (channels weigh blocks by them)
    last: Mark = before  # the mark of the window's last input so far

    def capacity() -> int:
        if layers:
            return int(layers[0]["window"])
        return size if part is None else parts[part] - (parts[part - 1] if part else 0)

    def emit() -> Block:
        nonlocal before, skip, items, refs, part, held, layers
        out, out_refs = transform(before, items, refs, capacity(), layers)
        if any(x is REPLAYED for x in out[skip:]):  # the skips were computed for this window
            raise RuntimeError("shuffle: a restored window would deliver a skipped item")
        tag = {"part": part} if part is not None else {"layers": layers} if layers else None
        rows = WindowRows(before, high_water(last), tag, skip, out_refs[skip:])
        block = Block(
            lane, out[skip:], nbytes=int(held * (len(out) - skip) / max(1, len(out))), rows=rows
        )
        before, skip, layers = last, 0, []
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

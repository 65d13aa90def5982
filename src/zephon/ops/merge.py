"""merge: a rank's lanes interleaved item by item, round-robin, into one stream."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from zephon.engine.channel import Channel
from zephon.engine.runner import forward, timed_receive
from zephon.engine.stats import StageStats
from zephon.ops.block import Block, Interleaved

__all__ = ["merge_lanes"]

_FLUSH_ITEMS = 256


async def merge_lanes(
    lanes: Sequence[Channel[Block]],
    out: Channel[Block],
    stats: StageStats,
    deterministic: bool,
    first: int = 0,
    ended: Sequence[int] = (),
    names: Sequence[int] = (),
    max_bytes: int = 1 << 62,
) -> None:
    """The merge stage: :func:`merged` into ``out``."""
    blocks = merged(lanes, stats, deterministic, first, ended, names, max_bytes)
    await forward(blocks, out, stats)


async def merged(
    lanes: Sequence[Channel[Block]],
    stats: StageStats,
    deterministic: bool,
    first: int = 0,
    ended: Sequence[int] = (),
    names: Sequence[int] = (),
    max_bytes: int = 1 << 62,
) -> AsyncIterator[Block]:
    """One item from each lane in turn (a lane that ended is skipped from then on). With
    ``deterministic=False``, whichever lane has items ready goes first.

    ``first`` is the position (in ``lanes``) whose turn it is; lanes at positions in
    ``ended`` are known to have ended (a restored run). Output blocks record, in
    ``extra["ended"]``, the lane names (``names``) seen to end so far, for checkpoints.
    An output block holds at most ``_FLUSH_ITEMS`` items and about ``max_bytes`` (by its
    lane blocks' ``nbytes``).

    Long because it is one loop over items with three paths (whole rounds, a single lane,
    one item) sharing the same buffers; helpers would cost a call per merged item.
    """
    buffers: list[tuple[Block, int] | None] = [None] * len(lanes)
    active = [i for i in range(len(lanes)) if i not in set(ended)]
    finished = {names[i] for i in ended} if names else set()
    items: list[Any] = []
    rows = Interleaved()  # where the items came from, kept as runs of lane blocks
    nbytes = 0.0

    def flush() -> list[Block]:
        """The items taken so far as a block (none if there are none)."""
        nonlocal items, rows, nbytes
        if not items:
            return []
        block = Block(-1, items, nbytes=int(nbytes), rows=rows)
        block.extra["ended"] = frozenset(finished)
        items, rows, nbytes = [], Interleaved(), 0.0
        return [block]

    turn = active.index(first) if first in active else 0
    while active:
        if not deterministic:
            ready = [i for i in active if buffers[i] is not None or len(lanes[i])]
            if ready and active[turn % len(active)] not in ready:
                turn = active.index(ready[0])
        if (
            deterministic
            and len(active) > 1
            and all(
                buffers[i] is not None and buffers[i][1] < len(buffers[i][0].items)  # type: ignore[index]
                for i in active
            )
        ):
            # Every lane has items buffered: take whole rounds at once (zip interleaves
            # in C), starting with the lane whose turn it is.
            start = turn % len(active)
            order = active[start:] + active[:start]
            entries = [buffers[i] for i in order]
            take = min(len(e[0].items) - e[1] for e in entries)  # type: ignore[index]
            columns = [e[0].items[e[1] : e[1] + take] for e in entries]  # type: ignore[index]
            items.extend(x for group in zip(*columns, strict=True) for x in group)
            rows.add(list(entries), take)  # type: ignore[arg-type]
            for i, e in zip(order, entries, strict=True):
                buffers[i] = (e[0], e[1] + take)  # type: ignore[index]
                nbytes += _per_item(e[0]) * take  # type: ignore[index]
            if len(items) >= _FLUSH_ITEMS or nbytes >= max_bytes:
                for b in flush():
                    yield b
            continue
        if len(active) == 1:
            # A single lane: its blocks go through whole.
            lane = active[0]
            entry, buffers[lane] = buffers[lane], None
            if entry is not None and entry[1] < len(entry[0].items):
                block, i = entry
                items.extend(block.items[i:])
                rows.add([(block, i)], len(block.items) - i)
                nbytes += _per_item(block) * (len(block.items) - i)
                for b in flush():
                    yield b
                continue
            for b in flush():
                yield b
            try:
                block = await timed_receive(lanes[lane], stats)
            except StopAsyncIteration:
                active.remove(lane)
                if names:
                    finished.add(names[lane])
                continue
            stats.items_in += len(block.items)
            if block.items:
                yield block.with_extra(ended=frozenset(finished))
            continue
        lane = active[turn % len(active)]
        entry = buffers[lane]
        while entry is None or entry[1] >= len(entry[0].items):
            if not len(lanes[lane]):
                for b in flush():
                    yield b
            try:
                block = await timed_receive(lanes[lane], stats)
            except StopAsyncIteration:
                entry = None
                break
            stats.items_in += len(block.items)
            entry = (block, 0)
        if entry is None:
            buffers[lane] = None
            active.remove(lane)
            if names:
                finished.add(names[lane])
            continue
        block, i = entry
        items.append(block.items[i])
        rows.add([(block, i)], 1)
        buffers[lane] = (block, i + 1)
        nbytes += _per_item(block)
        turn = (active.index(lane) + 1) % len(active)
        if len(items) >= _FLUSH_ITEMS or nbytes >= max_bytes:
            for b in flush():
                yield b
    for b in flush():
        yield b


def _per_item(block: Block) -> float:
    return block.nbytes / len(block.items) if block.items else 0.0

"""A restored run starts its lanes in the merge's order, each once the one before it has a
block ready (or has ended)."""

from __future__ import annotations

import asyncio

from zephon.engine.channel import Channel
from zephon.pipeline.run import _start_after


async def test_a_lane_starts_when_the_one_before_it_has_a_block() -> None:
    before: Channel[int] = Channel(4)
    start = asyncio.Event()
    waiter = asyncio.create_task(_start_after(before, start))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    assert not start.is_set()
    await before.send(1)
    await waiter
    assert start.is_set()
    assert await before.receive() == 1  # the block is left for the merge


async def test_a_lane_that_ends_without_a_block_lets_the_next_start() -> None:
    before: Channel[int] = Channel(4)
    start = asyncio.Event()
    waiter = asyncio.create_task(_start_after(before, start))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    before.close()
    await waiter
    assert start.is_set()


async def test_a_block_taken_at_once_still_counts() -> None:
    """The merge may take the block before the waiter runs: the event woke it already."""
    before: Channel[int] = Channel(4)
    start = asyncio.Event()
    waiter = asyncio.create_task(_start_after(before, start))  # type: ignore[arg-type]
    await asyncio.sleep(0)
    await before.send(1)
    assert await before.receive() == 1
    await asyncio.wait_for(waiter, 5)
    assert start.is_set()

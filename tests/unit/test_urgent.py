"""The helper thread of in-process steps runs the most urgent waiting call first, and a
lane's first items are cut where the shuffle's warm-up parts end, however blocks arrive."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.engine.urgent import UrgentThread
from zephon.ops.block import Block
from zephon.ops.windows import first_parts
from zephon.pipeline.steps import first_pieces


def _held(thread: UrgentThread) -> tuple[threading.Event, threading.Event]:
    """Occupy the thread until the returned ``release`` is set; ``running`` once it runs."""
    running, release = threading.Event(), threading.Event()

    def hold() -> None:
        running.set()
        release.wait(30)

    thread.submit((-1,), hold)
    assert running.wait(30)
    return running, release


def test_waiting_calls_run_smallest_key_first_then_first_come() -> None:
    thread = UrgentThread("t")
    order: list[str] = []
    _, release = _held(thread)
    futures = [
        thread.submit(key, order.append, name)
        for key, name in [
            ((512, 0), "far"),
            ((64, 0), "a"),
            ((0, -2), "start, later step"),
            ((0, 0), "start"),
            ((64, 0), "b"),
        ]
    ]
    release.set()
    for f in futures:
        f.result(30)
    assert order == ["start, later step", "start", "a", "b", "far"]
    thread.shutdown()


def test_results_and_errors_reach_the_caller_through_run_in_executor() -> None:
    thread = UrgentThread("t")

    async def main() -> tuple[int, str]:
        loop = asyncio.get_running_loop()
        value = await loop.run_in_executor(thread.at((0,)), pow, 2, 10)
        with pytest.raises(ZeroDivisionError) as caught:
            await loop.run_in_executor(thread.at((1,)), divmod, 1, 0)
        return value, type(caught.value).__name__

    assert asyncio.run(main()) == (1024, "ZeroDivisionError")
    thread.shutdown()


def test_shutdown_cancels_waiting_calls_lets_the_running_one_end_and_refuses_more() -> None:
    thread = UrgentThread("t")
    _, release = _held(thread)
    ran: list[int] = []
    waiting = thread.submit((5,), ran.append, 5)
    stopper = threading.Thread(target=thread.shutdown)
    stopper.start()
    release.set()  # the running call ends; shutdown returns after it
    stopper.join(30)
    assert not stopper.is_alive()
    assert waiting.cancelled() and ran == []
    with pytest.raises(RuntimeError, match="after shutdown"):
        thread.submit((0,), ran.append, 0)


def test_a_cancelled_call_is_skipped() -> None:
    thread = UrgentThread("t")
    _, release = _held(thread)
    ran: list[int] = []
    dropped = thread.submit((1,), ran.append, 1)
    kept = thread.submit((2,), ran.append, 2)
    assert dropped.cancel()
    release.set()
    kept.result(30)
    assert ran == [2]
    thread.shutdown()


def test_the_thread_never_keeps_the_interpreter_alive() -> None:
    thread = UrgentThread("t")
    thread.submit((0,), int).result(30)
    assert thread._thread is not None and thread._thread.daemon
    thread.shutdown()


async def _pieces(sizes: list[int]) -> list[int]:
    async def blocks() -> AsyncIterator[Block]:
        start = 0
        for n in sizes:
            ids = list(range(start, start + n))
            yield Block(0, ids, [(0, 0, i, 0) for i in ids], [(0, None, i, (), None) for i in ids])
            start += n

    out = []
    async for piece in first_pieces(blocks(), 64):
        out.append(piece.items)
    flat = [x for items in out for x in items]
    assert flat == list(range(sum(sizes)))  # nothing lost, reordered or repeated
    return [len(items) for items in out]


def test_a_short_first_block_does_not_shift_the_pieces() -> None:
    """A lane whose first block is short (a run ending at a shard's end) still has pieces
    ending at 64, 128, 256 items: it was cut 64 items after wherever its blocks began, so
    every part of its shuffle waited for one block more than the other lanes'."""
    assert asyncio.run(_pieces([15, 100, 300])) == [15, 49, 51, 13, 128, 159]
    assert asyncio.run(_pieces([1000])) == [64, 64, 128, 256, 488]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(1, 400), min_size=1, max_size=12))
def test_pieces_end_at_every_warmup_part_end_within_the_items(sizes: list[int]) -> None:
    lengths = asyncio.run(_pieces(sizes))
    ends, at = set(), 0
    for n in lengths:
        at += n
        ends.add(at)
    total = sum(sizes)
    assert {e for e in first_parts(1 << 20, 64) if e < total} <= ends
    # and no piece is cut anywhere else than at a part's end or a block's end
    block_ends, at = set(), 0
    for n in sizes:
        at += n
        block_ends.add(at)
    assert ends <= block_ends | set(first_parts(1 << 20, 64))

"""The sync bridge asks for the next item while the consumer holds the current one (issue
16, item 3: at each new block the consumer waited for a turn of a busy event loop although
the block was ready), and the read-ahead changes nothing else: errors arrive in order, and
closing stops a pending fetch."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator

import pytest

from zephon.pipeline.bridge import SyncBridge


def test_the_next_item_is_fetched_while_the_consumer_holds_one() -> None:
    asked = threading.Event()

    async def items() -> AsyncGenerator[int, None]:
        yield 1
        asked.set()  # runs only once someone asks for the second item
        yield 2

    bridge = SyncBridge(items())
    try:
        it = iter(bridge)
        assert next(it) == 1
        assert asked.wait(10), "the bridge waited for the consumer to ask for item 2"
        assert next(it) == 2
        assert list(it) == []
    finally:
        bridge.close()


def test_an_error_after_an_item_arrives_after_that_item() -> None:
    async def items() -> AsyncGenerator[int, None]:
        yield 1
        raise ValueError("broken shard")

    bridge = SyncBridge(items())
    try:
        it = iter(bridge)
        assert next(it) == 1
        with pytest.raises(ValueError, match="broken shard"):
            next(it)
    finally:
        bridge.close()


def test_closing_stops_a_fetch_that_would_never_end() -> None:
    started = threading.Event()
    released = threading.Event()

    async def items() -> AsyncGenerator[int, None]:
        try:
            yield 1
            started.set()
            await asyncio.Event().wait()  # a source that never gives a second item
            yield 2
        finally:
            released.set()

    bridge = SyncBridge(items())
    it = iter(bridge)
    assert next(it) == 1
    assert started.wait(10)
    bridge.close()
    assert released.is_set() and not bridge.thread.is_alive()

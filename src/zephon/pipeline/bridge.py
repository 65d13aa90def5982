"""The sync bridge: an async generator run on a background event loop, consumed by a plain
``for`` in the calling thread. It knows nothing of stages; whole blocks cross threads."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator, Iterator
from typing import Generic, TypeVar

__all__ = ["SyncBridge", "new_loop"]

T = TypeVar("T")


def new_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop when uvloop is installed, else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class SyncBridge(Generic[T]):
    """Runs ``agen`` on a loop of its own thread; iterating yields its items here, one
    ``run_coroutine_threadsafe`` per item. :meth:`close` closes the generator on its loop
    (which releases whatever it holds) and stops the thread."""

    def __init__(self, agen: AsyncGenerator[T, None]) -> None:
        self.loop = new_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="zephon-loop", daemon=True
        )
        self.thread.start()
        self.agen = agen
        self.closed = False

    def __iter__(self) -> Iterator[T]:
        while True:
            item = asyncio.run_coroutine_threadsafe(self._next(), self.loop).result()
            if item is None:
                return
            yield item[0]

    async def _next(self) -> tuple[T] | None:
        try:
            return (await self.agen.__anext__(),)
        except StopAsyncIteration:
            return None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            asyncio.run_coroutine_threadsafe(self.agen.aclose(), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()

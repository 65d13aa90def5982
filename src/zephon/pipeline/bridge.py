"""The sync bridge: an async generator run on a background event loop, consumed by a plain
``for`` in the calling thread. It knows nothing of stages; whole blocks cross threads.

Lifecycle: a bridge never keeps the interpreter alive. Its loop runs on a daemon thread, and
every bridge still open when the interpreter exits is closed by an ``atexit`` hook (which runs
while daemon threads still work), each within a bounded time, so a script that drops out with
a live iterator (an exception, Ctrl-C, or simply the end of the script) exits promptly.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import sys
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["SyncBridge", "aiterate", "new_loop"]

T = TypeVar("T")

CLOSE_TIMEOUT_S = 5.0  # a close that waits longer leaves the rest to the daemon thread's end
EXIT_TIMEOUT_S = 1.0  # per bridge still open at interpreter exit
WAKE_S = 0.2  # the consumer's thread wakes this often while it waits for an item

_OPEN: weakref.WeakSet[SyncBridge[object]] = weakref.WeakSet()


def new_loop() -> asyncio.AbstractEventLoop:
    """A uvloop event loop when uvloop is installed, else asyncio's."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class SyncBridge(Generic[T]):
    """Runs ``agen`` on a loop of its own thread; iterating yields its items here, one
    ``run_coroutine_threadsafe`` per item. :meth:`close` stops whatever step is in flight,
    closes the generator on its loop (which releases what it holds) and stops the thread.
    Safe to call from any thread, more than once."""

    def __init__(self, agen: AsyncGenerator[T, None]) -> None:
        self.loop = new_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="zephon-loop", daemon=True
        )
        self.thread.start()
        self.agen = agen
        self.closed = False
        self._step: asyncio.Task[tuple[T] | None] | None = None
        self._lock = threading.Lock()
        _OPEN.add(self)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        # The next item is asked for as soon as one arrives, before it is yielded: while the
        # consumer works through it, the loop fetches the next one. Asking only when the
        # consumer came back made every item wait for a turn of the loop, which may be
        # busy with a lane's window (20-30 ms) although the item was ready.
        pending = asyncio.run_coroutine_threadsafe(self._next(), self.loop)
        while not self.closed:
            while not pending.done():  # timed waits: a Ctrl-C another thread got is seen
                concurrent.futures.wait([pending], WAKE_S)
            item = pending.result()
            if item is None:
                return
            pending = asyncio.run_coroutine_threadsafe(self._next(), self.loop)
            yield item[0]

    async def _next(self) -> tuple[T] | None:
        self._step = asyncio.current_task()
        try:
            return (await self.agen.__anext__(),)
        except StopAsyncIteration:
            return None
        finally:
            self._step = None

    async def _shutdown(self) -> None:
        step = self._step
        if step is not None and not step.done():  # the consumer left mid-step (an exception)
            step.cancel()
            with contextlib.suppress(BaseException):
                await step
        await self.agen.aclose()

    def close(self, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
        """Close the generator on its loop and stop the loop's thread (waits at most about
        ``timeout_s`` for each)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        _OPEN.discard(self)  # type: ignore[arg-type]
        try:
            if self.thread.is_alive() and not sys.is_finalizing():
                done = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
                with contextlib.suppress(concurrent.futures.TimeoutError):
                    done.result(timeout_s)
        finally:
            if self.thread.is_alive():
                self.loop.call_soon_threadsafe(self.loop.stop)
                self.thread.join(timeout_s)
            if not self.thread.is_alive():
                self.loop.close()


@atexit.register
def _close_open_bridges() -> None:
    for bridge in list(_OPEN):
        bridge.close(EXIT_TIMEOUT_S)


async def aiterate(items: Generator[Any, None, None]) -> AsyncIterator[Any]:
    """``items`` for ``async for``: each item waited for on a helper thread."""
    end = object()
    try:
        while (item := await asyncio.to_thread(next, items, end)) is not end:
            yield item
    finally:
        items.close()

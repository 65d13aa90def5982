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
import concurrent.futures.process
import concurrent.futures.thread
import contextlib
import queue
import sys
import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["SyncBridge", "aiterate", "consuming", "new_loop"]

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
        self._stopping = False  # set on the loop by the close: no step starts after it
        self._step: asyncio.Task[tuple[T] | None] | None = None
        self._lock = threading.Lock()
        _OPEN.add(self)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[T]:
        # The next item is asked for as soon as one arrives, before it is yielded: while the
        # consumer works through it, the loop fetches the next one. Asking only when the
        # consumer came back made every item wait for a turn of the loop, which may be
        # busy with a lane's window (20-30 ms) although the item was ready.
        pending = self._ask()
        while pending is not None:
            while not pending.done():  # timed waits: a Ctrl-C another thread got is seen
                concurrent.futures.wait([pending], WAKE_S)
                if self.closed and not self.thread.is_alive():  # its loop stopped without it
                    return
            if pending.cancelled():  # closed from another thread (at exit, say): the end
                return
            item = pending.result()
            if item is None:
                return
            pending = self._ask()
            yield item[0]

    def _ask(self) -> concurrent.futures.Future[tuple[T] | None] | None:
        """The next step, on the loop; ``None`` once closed (from another thread, maybe:
        its loop may be closed already)."""
        with self._lock:
            if self.closed:
                return None
            return asyncio.run_coroutine_threadsafe(self._next(), self.loop)

    async def _next(self) -> tuple[T] | None:
        if self._stopping:  # asked for before a close from another thread, run after it
            return None
        self._step = asyncio.current_task()
        try:
            return (await self.agen.__anext__(),)
        except StopAsyncIteration:
            return None
        finally:
            self._step = None

    async def _shutdown(self) -> None:
        # A consumer on another thread may ask for the next item while this runs: that step
        # must not reach the generator (``anext(): asynchronous generator is already
        # running``, seen at exit with a consumer on a daemon thread).
        self._stopping = True
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


_CONSUMERS: dict[threading.Thread, int] = {}  # non-daemon threads iterating, how many times
_CONSUMERS_LOCK = threading.Lock()


@contextlib.contextmanager
def consuming() -> Iterator[None]:
    """Marks the current thread as iterating a pipeline until the block ends. When the main
    thread is done, the interpreter waits for its other non-daemon threads, but first runs
    ``concurrent.futures``' exit hooks, which shut down every process pool and the event
    loops' default thread pools: a training loop on a thread of its own then died with
    ``cannot schedule new futures after shutdown`` as the main thread returned. The hook
    below, run before those, waits for such threads (the interpreter would wait for them
    anyway; see ``_before_pools_shut_down``)."""
    thread = threading.current_thread()
    if thread is threading.main_thread() or thread.daemon:
        yield
        return
    with _CONSUMERS_LOCK:
        _CONSUMERS[thread] = _CONSUMERS.get(thread, 0) + 1
    try:
        yield
    finally:
        with _CONSUMERS_LOCK:
            if _CONSUMERS[thread] > 1:
                _CONSUMERS[thread] -= 1
            else:
                del _CONSUMERS[thread]


def _before_pools_shut_down() -> None:
    """The main thread is done: wait for the threads still consuming, then close what is left
    open (iterators a script dropped, consumers on daemon threads), before the pools those
    pipelines use are shut down under them (a daemon consumer then got ``cannot schedule new
    futures after shutdown`` from a read on the loop's thread pool)."""
    while True:
        with _CONSUMERS_LOCK:
            alive = [thread for thread in _CONSUMERS if thread.is_alive()]
        if not alive:
            break
        for thread in alive:
            thread.join()
    _close_open_bridges()


# threading runs its exit hooks last registered first: ours after concurrent.futures' (their
# modules imported here, so already registered) runs before them.
_register = getattr(threading, "_register_atexit", None)
if _register is not None:
    _register(_before_pools_shut_down)


async def aiterate(items: Generator[T, None, None], stop: Callable[[], None]) -> AsyncIterator[T]:
    """``items`` for ``async for``: a daemon thread of its own takes each item when asked, so a
    generator that blocks holds neither the event loop nor an executor's thread (which the
    interpreter's exit would wait for). Leaving early (``break``, an exception, a cancelled
    task) calls ``stop`` on another thread (it must make a blocked ``next`` return); the
    generator is closed on its own thread once the call in flight is over (closed from here
    while that call ran, it raised ``generator already executing``). Nothing is awaited on
    the way out: a generator finalised as its loop shuts down may not wait."""
    loop = asyncio.get_running_loop()
    asks: queue.SimpleQueue[asyncio.Future[Any] | None] = queue.SimpleQueue()
    end = object()

    def serve() -> None:
        try:
            while (asked := asks.get()) is not None:
                try:
                    _answer(loop, asked, next(items, end), None)
                except BaseException as exc:
                    _answer(loop, asked, None, exc)
        finally:
            items.close()

    threading.Thread(target=serve, name="zephon-aiterate", daemon=True).start()
    finished = False
    try:
        while True:
            asked: asyncio.Future[Any] = loop.create_future()
            asks.put(asked)
            item = await asked
            if item is end:
                finished = True
                return
            yield item
    finally:
        if not finished:
            threading.Thread(target=stop, name="zephon-stop", daemon=True).start()
        asks.put(None)


def _answer(
    loop: asyncio.AbstractEventLoop,
    future: asyncio.Future[Any],
    value: Any,
    error: BaseException | None,
) -> None:
    """Settle ``future`` on its loop from another thread (unless it was cancelled)."""

    def settle() -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(settle)

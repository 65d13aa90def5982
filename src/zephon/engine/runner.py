"""Running stages: structured concurrency for a pipeline.

Every task of a running pipeline belongs to one :class:`asyncio.TaskGroup`. Stages talk over
bounded :class:`~zephon.engine.channel.Channel` objects, end their output by closing it, and
on failure the group cancels every other stage; :func:`first_error` turns the group's
``ExceptionGroup`` back into the one exception that started it, annotated with its stage.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from zephon.engine.channel import Channel, Escaped, carry, closing
from zephon.engine.stats import StageStats
from zephon.errors import first_error

__all__ = [
    "Escaped",
    "SlowStart",
    "first_error",
    "forward",
    "ordered",
    "spawn",
    "stage",
    "start_stage",
    "timed_receive",
    "timed_send",
]

A = TypeVar("A")
B = TypeVar("B")


def _name_stage(exc: BaseException, name: str) -> None:
    if not any(str(n).startswith("zephon: in stage") for n in getattr(exc, "__notes__", ())):
        exc.add_note(f"zephon: in stage {name!r}")


def spawn(
    tg: asyncio.TaskGroup, coro: Coroutine[Any, Any, A], *inner: Coroutine[Any, Any, Any]
) -> asyncio.Task[A]:
    """``tg.create_task(coro)``. A group already shutting down (the run is ending: a stop, or
    a failure elsewhere, which cancels every task of the group, the caller included) starts
    nothing: ``coro`` and the coroutines it wraps (``inner``) are closed unstarted and the
    caller's cancellation goes on. Stages and calls are started from running tasks (a
    re-laned lane's next residue, every call of :func:`ordered`); a ``RuntimeError`` there
    used to leave those coroutines "never awaited" and the error in the group's."""
    try:
        return tg.create_task(coro)
    except RuntimeError:
        for c in (coro, *inner):
            c.close()
        raise asyncio.CancelledError from None


def start_stage(
    tg: asyncio.TaskGroup, name: str, stats: StageStats, body: Coroutine[Any, Any, None]
) -> None:
    """Run ``body`` as the stage ``name`` in ``tg`` (see :func:`stage` and :func:`spawn`).
    A stage task cancelled before its first step (the run stopped or failed just after it
    was started) never reaches ``await body``: the body is closed when the task is done,
    which changes nothing for a body that ran."""
    task = spawn(tg, stage(name, stats, body), body)
    task.add_done_callback(lambda _: body.close())


async def stage(name: str, stats: StageStats, body: Coroutine[Any, Any, None]) -> None:
    """Run one stage's coroutine, timing it and naming it in any error it raises."""
    stats.start()
    try:
        await body
    except Exception as exc:
        _name_stage(exc, name)
        raise
    except (KeyboardInterrupt, SystemExit) as exc:
        raise carry(exc) from exc
    finally:
        stats.finish()


async def timed_receive(source: Channel[A], stats: StageStats) -> A:
    t = time.perf_counter()
    try:
        return await source.receive()
    finally:
        stats.waiting_s += time.perf_counter() - t


async def timed_send(out: Channel[B], item: B, stats: StageStats) -> None:
    t = time.perf_counter()
    try:
        await out.send(item)
    finally:
        stats.waiting_s += time.perf_counter() - t


async def forward(
    blocks: AsyncIterator[B],
    out: Channel[B],
    stats: StageStats,
    size: Callable[[B], int] = len,  # type: ignore[assignment]
) -> None:
    """The plumbing every stage shares: send each of ``blocks`` to ``out``, counting what
    leaves (``size``: the items a block holds) and how long the stage waited to send, and
    close ``out`` at the end, whether ``blocks`` ends or fails (and ``blocks`` with it, an
    async generator left suspended when the stage is cancelled)."""
    with closing(out):
        async with _aclosing(blocks):
            async for block in blocks:
                stats.items_out += size(block)
                await timed_send(out, block, stats)


async def ordered(
    tg: asyncio.TaskGroup,
    source: AsyncIterator[A],
    fn: Callable[[A], Awaitable[B]],
    out: Channel[B],
    concurrency: int,
    stats: StageStats,
    *,
    deterministic: bool = True,
    size: Callable[[Any], int] | None = None,
    ramp: int | None = None,
) -> None:
    """Apply ``fn`` to every item of ``source`` with up to ``concurrency`` calls in flight,
    sending results to ``out`` in input order (or completion order if not ``deterministic``).
    Closes ``out`` when done. Its tasks live in ``tg``, so a failure cancels them all.
    ``size`` says what an input or output counts for in ``stats`` (default 1: blocks and
    request groups count their items with ``len``). ``ramp``: a slow start, see
    :class:`SlowStart`. Long because its three coroutines share the channel, the gate and the
    stats; apart, they would pass all three around."""
    pending: Channel[asyncio.Task[B]] = Channel(concurrency)
    gate = SlowStart(ramp, concurrency) if ramp is not None and ramp < concurrency else None

    async def start_all() -> None:
        with closing(pending):
            async with _aclosing(source):
                await feed()

    async def feed() -> None:
        async for item in source:
            stats.items_in += 1 if size is None else size(item)
            if gate is not None:
                await gate.acquire()
            task = spawn(tg, _call(fn, item, stats.name))
            if gate is not None:
                task.add_done_callback(gate.release)
            await timed_send(pending, task, stats)

    async def in_order() -> AsyncIterator[B]:
        async for task in pending:
            yield await task

    async def as_completed() -> AsyncIterator[B]:
        running: set[asyncio.Task[B]] = set()
        source_done = False
        while running or not source_done:
            if not source_done and (not running or len(pending)):
                try:
                    running.add(await pending.receive())
                    continue
                except StopAsyncIteration:
                    source_done = True
                    continue
            done, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                yield task.result()

    spawn(tg, start_all())
    results = in_order() if deterministic else as_completed()
    await forward(results, out, stats, (lambda _: 1) if size is None else size)


@contextlib.asynccontextmanager
async def _aclosing(source: AsyncIterator[Any]) -> AsyncIterator[None]:
    """Close ``source`` (an async generator) when its consumer stops, even while suspended
    outside it; left to the garbage collector, its ``aclose`` would become a stray task."""
    try:
        yield
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()


class SlowStart:
    """At most ``initial`` calls in flight at first, one more each time a call completes, up
    to ``limit``: the window doubles about once per call duration, as TCP's slow start does.

    Fetching starts this way so that the first reads have the link to themselves: with every
    read of a lane started at once, the one the first batch waits for shares the bandwidth
    with dozens of others and arrives with the last of them."""

    def __init__(self, initial: int, limit: int) -> None:
        self._permits = asyncio.Semaphore(max(1, initial))
        self._granted = max(1, initial)
        self._limit = limit

    def ready(self) -> bool:
        """Whether a call may start now."""
        return not self._permits.locked()

    async def acquire(self) -> None:
        await self._permits.acquire()

    def release(self, _: object = None) -> None:
        self._permits.release()
        if self._granted < self._limit:
            self._granted += 1
            self._permits.release()


async def _call(fn: Callable[[A], Awaitable[B]], item: A, name: str) -> B:
    # Named here, not only by the stage: the task group may cancel the stage before it sees
    # this task's exception.
    try:
        return await fn(item)
    except Exception as exc:
        _name_stage(exc, name)
        raise
    except (KeyboardInterrupt, SystemExit) as exc:
        raise carry(exc) from exc

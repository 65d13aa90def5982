"""Running stages: structured concurrency for a pipeline.

Every task of a running pipeline belongs to one :class:`asyncio.TaskGroup`. Stages talk over
bounded :class:`~zephon.engine.channel.Channel` objects, end their output by closing it, and
on failure the group cancels every other stage; :func:`first_error` turns the group's
``ExceptionGroup`` back into the one exception that started it, annotated with its stage.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from zephon.engine.channel import Channel, Escaped, carry, closing
from zephon.engine.stats import StageStats
from zephon.errors import first_error

__all__ = ["Escaped", "first_error", "ordered", "stage", "timed_receive", "timed_send"]

A = TypeVar("A")
B = TypeVar("B")


def _name_stage(exc: BaseException, name: str) -> None:
    if not any(str(n).startswith("zephon: in stage") for n in getattr(exc, "__notes__", ())):
        exc.add_note(f"zephon: in stage {name!r}")


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
) -> None:
    """Apply ``fn`` to every item of ``source`` with up to ``concurrency`` calls in flight,
    sending results to ``out`` in input order (or completion order if not ``deterministic``).
    Closes ``out`` when done. Its tasks live in ``tg``, so a failure cancels them all.
    ``size`` says what an input or output counts for in ``stats`` (default 1: blocks and
    request groups count their items with ``len``)."""
    pending: Channel[asyncio.Task[B]] = Channel(concurrency)

    async def start_all() -> None:
        with closing(pending):
            async for item in source:
                stats.items_in += 1 if size is None else size(item)
                await timed_send(pending, tg.create_task(_call(fn, item, stats.name)), stats)

    async def finish_in_order() -> None:
        with closing(out):
            async for task in pending:
                result = await task
                stats.items_out += 1 if size is None else size(result)
                await timed_send(out, result, stats)

    async def finish_as_completed() -> None:
        running: set[asyncio.Task[B]] = set()
        source_done = False
        with closing(out):
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
                    stats.items_out += 1 if size is None else size(task.result())
                    await timed_send(out, task.result(), stats)

    tg.create_task(start_all())
    await (finish_in_order() if deterministic else finish_as_completed())


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

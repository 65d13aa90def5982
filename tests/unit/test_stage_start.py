"""Stages and calls started from running tasks while the run's task group shuts down."""

from __future__ import annotations

import asyncio
import gc

import pytest

from zephon.engine.runner import spawn, start_stage
from zephon.engine.stats import StageStats


async def _fail() -> None:
    raise ValueError("a stage failed")


async def test_a_stage_started_as_its_group_shuts_down_is_closed_unstarted() -> None:
    """A re-laned lane starts its next residue's stages from a running task. If another
    stage failed meanwhile, the group refuses new tasks: the stage (and the body it wraps)
    must end unstarted and the caller be cancelled, not leave coroutines never awaited
    (a warning at every stop) and a ``RuntimeError`` in the group's errors."""
    ran: list[str] = []
    outcome: list[str] = []

    async def body() -> None:
        ran.append("body")

    def late(tg: asyncio.TaskGroup) -> None:
        try:
            start_stage(tg, "late", StageStats("late"), body())
        except asyncio.CancelledError:
            outcome.append("cancelled")
        try:
            spawn(tg, body())
        except asyncio.CancelledError:
            outcome.append("cancelled")

    with pytest.raises(ExceptionGroup) as caught:
        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(_fail())
            task.add_done_callback(lambda _: late(tg))  # after the group began shutting down
    assert [type(e) for e in caught.value.exceptions] == [ValueError]
    gc.collect()  # an unclosed coroutine warns when collected (an error under pytest here)
    assert outcome == ["cancelled", "cancelled"] and ran == []


async def test_spawn_in_a_live_group_runs_the_coroutine() -> None:
    async def answer() -> int:
        return 42

    async with asyncio.TaskGroup() as tg:
        task = spawn(tg, answer())
    assert task.result() == 42


async def test_a_stage_cancelled_before_its_first_step_closes_its_body() -> None:
    """The run stops (or fails) right after starting a stage: its task is cancelled before
    it ever runs, so the stage never awaits the body it was given."""
    ran: list[str] = []

    async def body() -> None:
        ran.append("body")

    with pytest.raises(ExceptionGroup):
        async with asyncio.TaskGroup() as tg:
            start_stage(tg, "early", StageStats("early"), body())
            raise ValueError("the run failed before the stage's task ran")
    gc.collect()  # an unclosed coroutine warns when collected (an error under pytest here)
    assert ran == []

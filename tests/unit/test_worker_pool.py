"""The worker pool starts off the event loop and is never started twice."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from zephon.engine.pool import WorkerPool


async def test_calls_during_a_start_wait_for_it_and_use_its_workers() -> None:
    pool = WorkerPool(2)
    pool.start_soon(["json"])
    try:
        # Called at once, before the helper thread has made the executor: no second pool.
        pids = await asyncio.gather(*(pool.run("s", os.getpid) for _ in range(8)))
        assert set(pids) <= set(pool.pids()) and len(pool.pids()) == 2
        assert os.getpid() not in pids
    finally:
        await pool.started()
        workers = list(pool.pids())
        pool.shutdown()
    for pid in workers:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_the_loop_runs_while_the_pool_starts() -> None:
    pool = WorkerPool(1)
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.create_task(tick())
    pool.start_soon(["json"])
    try:
        await asyncio.sleep(0)
        at_start = ticks
        await pool.started()  # a fresh interpreter's start: the loop turned meanwhile
        assert ticks > at_start + 10
    finally:
        ticker.cancel()
        pool.shutdown()


async def test_a_shutdown_during_the_start_leaves_no_workers() -> None:
    from multiprocessing import forkserver

    pool = WorkerPool(2)
    pool.start_soon(["json"])
    pool.shutdown()  # at once: the start is under way on its thread
    assert not pool.pids()
    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    children = Path(f"/proc/{server}/task/{server}/children")
    if server is None or not children.exists():
        pytest.skip("needs the fork server and /proc")
    assert children.read_text().split() == []  # every worker it forked has exited
    await pool.started()

"""The worker pool starts off the event loop and is never started twice; GIL-free calls
made while it starts run on threads meanwhile."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Sequence
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


class _HeldStart(WorkerPool):
    """A pool whose start waits for ``go``: the test decides when the workers exist."""

    def __init__(self, processes: int) -> None:
        super().__init__(processes)
        self.go = threading.Event()

    def prestart(self, modules: Sequence[str] = ()) -> None:
        self.go.wait(60)
        super().prestart(modules)


def _fails(message: str) -> None:
    raise ValueError(message)


async def test_gil_free_calls_run_on_threads_while_the_workers_start() -> None:
    pool = _HeldStart(2)
    pool.start_soon(["json"])
    try:
        # The start is held: a GIL-free call runs here at once, on a thread...
        assert await pool.run("s", os.getpid, gil_free=True) == os.getpid()
        threads = await asyncio.gather(
            *(pool.run("s", threading.get_ident, gil_free=True) for _ in range(8))
        )
        assert threading.get_ident() not in threads and len(set(threads)) <= 2
        with pytest.raises(ValueError, match="bad image"):  # errors keep their type
            await pool.run("s", _fails, "bad image", gil_free=True)
        # ...any other call waits for the workers.
        waiting = asyncio.ensure_future(pool.run("s", os.getpid))
        for _ in range(20):
            await asyncio.sleep(0)
        assert not waiting.done()
        pool.go.set()
        assert await waiting in pool.pids()
        # Once they are up, GIL-free calls go to them too.
        assert await pool.run("s", os.getpid, gil_free=True) in pool.pids()
    finally:
        pool.go.set()
        await pool.started()
        pool.shutdown()
    assert pool._head_start is None  # its threads were stopped with the pool

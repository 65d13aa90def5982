"""The process pool a pipeline owns for CPU-heavy steps.

Work goes in batches (one call per block, not per sample). Workers start with ``forkserver``
where available (``spawn`` elsewhere), never ``fork``: the event loop's threads would be copied
into children in an undefined state. A worker that dies (killed, out of memory) breaks the pool;
that surfaces as :class:`~zephon.errors.WorkerCrashed`, never as a hang.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, TypeVar

from zephon.errors import WorkerCrashed

__all__ = ["WorkerPool"]

T = TypeVar("T")


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


class WorkerPool:
    """A lazily started :class:`ProcessPoolExecutor` with typed crash reporting."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self._executor: ProcessPoolExecutor | None = None

    def _get(self) -> ProcessPoolExecutor:
        if self._executor is None:
            self._executor = ProcessPoolExecutor(self.processes, mp_context=_context())
        return self._executor

    async def run(self, stage: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker. Exceptions raised by ``fn`` come back with their type."""
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._get(), fn, *args)
        except BrokenProcessPool:
            raise WorkerCrashed(
                f"a worker process died while running stage {stage!r} "
                "(killed, out of memory, or a crash in native code)"
            ) from None

    def pids(self) -> Sequence[int]:
        if self._executor is None:
            return ()
        return list(self._executor._processes)

    def shutdown(self) -> None:
        if self._executor is not None:
            executor, self._executor = self._executor, None
            executor.shutdown(wait=True, cancel_futures=True)

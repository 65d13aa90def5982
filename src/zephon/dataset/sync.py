"""Discovery and reads from synchronous code, in a notebook too."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

__all__ = ["run_sync"]

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code on a new event loop (uvloop's when
    installed, as the pipeline's: a discovery scan reads whole shards), in this thread or,
    when it already runs an event loop (Jupyter), on a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="zephon-sync") as helper:
        return helper.submit(_run, coro).result()


def _run(coro: Coroutine[Any, Any, T]) -> T:
    from zephon.pipeline.bridge import new_loop

    with asyncio.Runner(loop_factory=new_loop) as runner:
        return runner.run(coro)

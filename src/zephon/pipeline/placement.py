"""Where a CPU-heavy step runs: ``processes=N`` or ``executor=`` (see :mod:`zephon.executors`),
resolved to the step's blocks in flight per lane and its executor (``None``: the pipeline's
own process pool, or the event loop when no blocks go anywhere)."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

from zephon.errors import ConfigError
from zephon.executors import Local, Ray

__all__ = ["placement"]


def placement(processes: int, executor: Any, fn: Any, what: str) -> tuple[int, Ray | None]:
    """``(blocks in flight per lane, Ray executor or None)`` for a step.

    Raises:
        ConfigError: both given, an unknown executor, or ``fn`` cannot be shipped.
    """
    if processes < 0:
        raise ConfigError(f"processes must be >= 0, got {processes}")
    if executor is not None:
        if processes:
            raise ConfigError("give processes=N or executor=..., not both")
        if not isinstance(executor, Local | Ray):
            raise ConfigError(
                f"executor must be zephon.executors.Local(...) or Ray(...), got {executor!r}"
            )
    if isinstance(executor, Local):
        processes, executor = executor.processes, None
    if (processes or executor is not None) and asyncio.iscoroutinefunction(fn):
        raise ConfigError(f"an async {what} cannot run in worker processes")
    if isinstance(executor, Ray):
        return executor.inflight, executor  # shipped with cloudpickle: lambdas travel too
    if processes and fn is not None:
        try:
            pickle.dumps(fn)
        except Exception as exc:
            name = getattr(fn, "__qualname__", repr(fn))
            raise ConfigError(
                f"{what} {name!r} cannot be sent to worker processes ({exc}): with "
                "processes=N it must be picklable, e.g. a function defined at the top level "
                "of a module (not a lambda or a nested function), or use processes=0"
            ) from None
    return processes, None

"""Where a CPU-heavy step runs: ``processes=N`` or ``executor=`` (see :mod:`zephon.executors`),
resolved to the step's blocks in flight per lane and its executor (``None``: the pipeline's
own process pool, or the event loop when no blocks go anywhere); and how its function gets
there (:func:`shippable`)."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pickle
import sys
from typing import Any

from zephon.errors import ConfigError
from zephon.executors import Local, Ray

__all__ = [
    "ByValue",
    "check_main_can_start_workers",
    "placed",
    "placement",
    "shippable",
]


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
    if processes:
        check_main_can_start_workers()
    return processes, None


def placed(processes: int, executor: Any, fn: Any, what: str) -> tuple[int, Ray | None, Any]:
    """:func:`placement`, and ``fn`` as it travels to the pool's workers (:func:`shippable`)."""
    inflight, remote = placement(processes, executor, fn, what)
    return inflight, remote, shippable(fn, what) if inflight and remote is None else fn


def check_main_can_start_workers() -> None:
    """Refuse a ``__main__`` read from stdin (``python - < script.py``): its ``__file__`` is
    ``"<stdin>"``, which multiprocessing runs as a path in every new process, so each worker
    would die starting up.

    Raises:
        ConfigError: saying what to do instead.
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if path is not None and spec is None and not os.path.isfile(path):
        raise ConfigError(
            f"worker processes cannot start from a script read from {path!r}: multiprocessing "
            "runs the main script again by its path in every worker; save the script to a "
            "file (or run it with python -c), or keep the step in this process (processes=0)"
        )


class ByValue:
    """A function that travels to worker processes by value (cloudpickle's serialisation of
    its code and what it refers to), where a worker could not import it by name: a lambda, a
    nested function, or a function of a ``__main__`` that has no file (``python -c``, a
    script on stdin, a REPL, a notebook). Those once passed the pickle check and then failed
    in every block (``Can't get attribute 'fn' on <module '__main__'>``). Serialised once;
    a worker loads each distinct one once."""

    __slots__ = ("_blob", "_key", "fn")

    def __init__(self, fn: Any, blob: bytes | None = None) -> None:
        if blob is None:
            import cloudpickle

            blob = cloudpickle.dumps(fn)
        self.fn, self._blob = fn, blob
        self._key = hashlib.sha1(blob).digest()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @property
    def __name__(self) -> str:
        return str(getattr(self.fn, "__name__", "function"))

    def __reduce__(self) -> tuple[Any, ...]:
        return _loaded, (self._key, self._blob)


_LOADED: dict[bytes, ByValue] = {}


def _loaded(key: bytes, blob: bytes) -> ByValue:
    """In a worker: the function of ``blob``, unpickled once per process."""
    found = _LOADED.get(key)
    if found is None:
        found = _LOADED[key] = ByValue(pickle.loads(blob), blob)
        while len(_LOADED) > 64:
            _LOADED.pop(next(iter(_LOADED)))
    return found


def _by_name(fn: Any) -> bool:
    """Whether a worker can import ``fn`` by name (plain pickling works there)."""
    if getattr(fn, "__module__", None) == "__main__":
        main = sys.modules.get("__main__")
        if getattr(main, "__file__", None) is None:
            return False  # python -c, stdin, a REPL or a notebook: nothing to import
    try:
        pickle.dumps(fn)
    except Exception:
        return False
    return True


def shippable(fn: Any, what: str) -> Any:
    """``fn`` as it should travel to worker processes: itself when workers can import it by
    name, else :class:`ByValue`.

    Raises:
        ConfigError: ``fn`` cannot be serialised at all (it holds a lock, a socket...).
    """
    if fn is None or isinstance(fn, ByValue) or _by_name(fn):
        return fn
    try:
        return ByValue(fn)
    except Exception as exc:
        name = getattr(fn, "__qualname__", repr(fn))
        raise ConfigError(
            f"{what} {name!r} cannot be sent to worker processes ({type(exc).__name__}: "
            f"{exc}); it, or something it refers to, does not serialise: use processes=0"
        ) from None

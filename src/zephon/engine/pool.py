"""The process pool a pipeline owns for CPU-heavy steps.

Work goes in batches (one call per block, not per sample). Workers start with ``forkserver``
where available (``spawn`` elsewhere), never ``fork``: the event loop's threads would be copied
into children in an undefined state. A worker that dies (killed, out of memory) breaks the pool;
that surfaces as :class:`~zephon.errors.WorkerCrashed`, never as a hang.

Workers ignore SIGINT: Ctrl-C signals the whole process group, and the pipeline's owner (the
consumer's process) is the one to stop them. A worker interrupted mid-task would break the
pool in ways ``concurrent.futures`` does not always survive (its manager thread can die and
leave a worker that nobody stops, which then keeps the interpreter from exiting). Shutdown is
bounded: workers still alive after it are terminated, then killed.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import gc
import importlib
import itertools
import multiprocessing
import os
import select
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any, TypeVar

from zephon.engine import janitor, shm
from zephon.errors import ConfigError, WorkerCrashed

__all__ = ["WorkerPool", "refuse_unguarded"]

T = TypeVar("T")

SHUTDOWN_TIMEOUT_S = 5.0  # then stragglers are terminated
_pools = itertools.count()


def _start_worker(parent: int) -> None:
    """A worker's start: Ctrl-C is the parent's to handle (it stops the pool), and the worker
    ends when the parent process does, however it ended. Killed (SIGKILL, the out-of-memory
    killer), the parent tells nobody: each worker holds the other ends of the pool's pipes and
    of the fork server's, so none of them ever saw an end, and the fork server and every
    worker lived on, holding their memory, until the machine restarted."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    threading.Thread(target=_exit_with, args=(parent,), name="zephon-parent", daemon=True).start()


def _exit_with(pid: int) -> None:
    """End this process when process ``pid`` has ended (a pidfd where the kernel has them,
    else a check a second)."""
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined,unused-ignore]
    except (AttributeError, OSError):
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            except OSError:
                pass  # alive, another user's
            time.sleep(1.0)
    else:
        select.select([fd], [], [])
    os._exit(1)


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:
            continue


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _ignore_result(future: Any) -> None:
    if not future.cancelled():
        future.exception()  # retrieved: never "exception was never retrieved"


def _call_packed(prefix: str, fn: Callable[..., Any], args: shm.Packed) -> shm.Packed:
    """In a worker: ``fn(*args)``, its arguments' large bytes read from and its result's large
    arrays put in shared memory (:mod:`.shm`)."""
    return shm.pack(fn(*shm.unpack_args(args)), prefix)


def _cancel_call(call: weakref.ref[Future[Any]], out: Future[Any]) -> None:
    """``out`` is done: if it was cancelled, so is the call behind it (if not yet started)."""
    running = call()
    if out.cancelled() and running is not None:
        running.cancel()


def _unpacked(call: Future[shm.Packed], out: Future[Any], args: shm.Packed) -> None:
    """On the pool's result thread: the worker's result, unpacked as soon as it arrives
    (whether or not anyone still waits for it, so that its segment never outlives it); the
    segment of its arguments goes too."""
    shm.discard(args)
    if call.cancelled():
        out.cancel()
        return
    try:
        error = call.exception()
        value = None if error is not None else shm.unpack(call.result())
    except Exception as exc:
        error = exc
    if out.set_running_or_notify_cancel():
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(value)


def _start_hint(answered: bool) -> str:
    """What else to check when the pool broke before any worker answered: a script run as
    ``__main__`` whose top level builds the pipeline without ``if __name__ ==
    "__main__":`` runs again in each new worker (they import it, as every fork-server or
    spawn pool does), and the worker dies starting up."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if answered or not path or not _runs_unguarded(path):
        return ""
    return (
        "; a worker failed while starting: if your script builds and runs the pipeline "
        'at its top level, put that code under `if __name__ == "__main__":` (worker '
        "processes import the script when they start)"
    )


def _parse(source: str) -> ast.Module:
    """``ast.parse`` with the cycle collector paused: a script's tree is tens of thousands
    of objects, enough to set off a full collection, which in a trainer holding torch's
    million objects costs tens of milliseconds (the tree has no cycles: freed as it goes)."""
    paused = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if paused:
            gc.enable()


def refuse_unguarded() -> None:
    """Refuse to start workers from the unguarded top level of a script, before any starts:
    each would run the script again while importing it and die starting up, printing its
    own multiprocessing traceback beside ours.

    Raises:
        ConfigError: saying to add the guard.
    """
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    if path and _runs_unguarded(path):
        raise ConfigError(
            f"worker processes cannot start from the top level of {Path(path).name}: each "
            "worker imports the script and would run it again. Put the code that builds "
            'and runs the pipeline under `if __name__ == "__main__":`'
        )


def _runs_unguarded(path: str) -> bool:
    """Whether the main thread is running the top level of the script at ``path`` outside
    an ``if __name__ == "__main__":`` block: what each worker, importing the script, runs
    again. (Read from the source, not from the workers' exit codes: the executor forgets its
    workers once it sees one die, so those were there to read only some of the time.)"""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    line = None
    while frame is not None:
        if frame.f_code.co_name == "<module>" and frame.f_globals.get("__name__") == "__main__":
            line = frame.f_lineno
        frame = frame.f_back
    if line is None:
        return False
    try:
        tree = _parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return False
    guards = ('__name__ == "__main__"', '"__main__" == __name__')
    return not any(
        isinstance(node, ast.If)
        and ast.unparse(node.test).replace("'", '"') in guards
        and node.lineno <= line <= (node.end_lineno or node.lineno)
        for node in tree.body
    )


class WorkerPool:
    """A lazily started :class:`ProcessPoolExecutor` with typed crash reporting."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        # This pool's shared-memory segments are named after it (swept at shutdown).
        self._prefix = f"{janitor.owner_prefix()}p{next(_pools):x}_"
        self._executor: ProcessPoolExecutor | None = None
        self._starting: asyncio.Future[None] | None = None
        self._starter: threading.Thread | None = None
        self._answered = False  # a worker has returned a result: the workers did start
        self._head_start: ThreadPoolExecutor | None = None  # see run(gil_free=True)

    def _get(self) -> ProcessPoolExecutor:
        if self._executor is None:
            refuse_unguarded()
            janitor.ensure()  # the workers name their results' segments after this process
            self._executor = ProcessPoolExecutor(
                self.processes,
                mp_context=_context(),
                initializer=_start_worker,
                initargs=(os.getpid(),),
            )
            # Work still queued when the pool stops is dropped anyway: never let the
            # interpreter's exit wait for the queue's feeder thread to hand it to a worker
            # that is gone (seen as a hang at exit after Ctrl-C, under load).
            queue = getattr(self._executor, "_call_queue", None)
            if queue is not None:
                queue.cancel_join_thread()
        return self._executor

    def prestart(self, modules: Sequence[str] = ()) -> None:
        """Start the workers now and have each import ``modules`` (the steps' own), so
        their start-up overlaps planning and the first fetches instead of delaying the
        first block. Errors are left for the first real call to report.

        If this process has no fork server yet, it is started with ``modules`` imported
        (and ``__main__``, as by default): workers forked from it have them already, instead
        of each importing them at once on a busy machine."""
        if self._executor is None:
            ctx = _context()
            if ctx.get_start_method() == "forkserver":
                ctx.set_forkserver_preload(["__main__", *modules])
        executor = self._get()
        for _ in range(self.processes):
            executor.submit(_import_all, tuple(modules)).add_done_callback(_ignore_result)

    def start_soon(self, modules: Sequence[str] = ()) -> None:
        """:meth:`prestart` on a helper thread: starting the fork server and the workers
        takes a few hundred milliseconds (a fresh interpreter importing ``modules``), which
        the event loop spends fetching instead. Calls wait for it (:meth:`started`)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()

        def start() -> None:
            try:
                self.prestart(modules)
            except Exception:
                pass  # the first call reports it
            finally:
                loop.call_soon_threadsafe(_settle, done)

        # Its own short-lived thread: the loop's default executor would keep a thread alive
        # after the run.
        self._starter = threading.Thread(target=start, name="zephon-pool-start", daemon=True)
        self._starter.start()
        self._starting = done

    async def started(self) -> None:
        """Wait until a start begun by :meth:`start_soon` is over (whether or not it
        worked: a failure is the first call's to report)."""
        if self._starting is not None and not self._starting.done():
            await asyncio.wait([self._starting])
        self._join_starter(None)  # it has settled the future: only its return is left

    def _join_starter(self, timeout_s: float | None) -> None:
        if self._starter is not None:
            self._starter.join(timeout_s)
            self._starter = None

    async def run(self, stage: str, fn: Callable[..., T], *args: Any, gil_free: bool = False) -> T:
        """``fn(*args)`` in a worker. Exceptions raised by ``fn`` come back with their type.

        ``gil_free``: ``fn`` does its work without the interpreter lock and may run on
        threads (Zephon's image steps). While the workers are still starting, such calls run
        on ``processes`` threads of this process instead of waiting: the first blocks' images
        are decoded during the few hundred milliseconds a fork server takes to start."""
        loop = asyncio.get_running_loop()
        if self._starter is not None:  # once: later calls go straight to the workers
            if gil_free and self._starting is not None and not self._starting.done():
                if self._head_start is None:
                    self._head_start = ThreadPoolExecutor(self.processes, "zephon-head-start")
                return await loop.run_in_executor(self._head_start, functools.partial(fn, *args))
            await self.started()
        try:
            result = await asyncio.wrap_future(self._submit(fn, *args), loop=loop)
        except BrokenProcessPool:
            raise WorkerCrashed(
                f"a worker process died while running stage {stage!r} "
                "(killed, out of memory, or a crash in native code)" + _start_hint(self._answered)
            ) from None
        self._answered = True
        return result

    @property
    def segment_prefix(self) -> str:
        """The prefix of this pool's shared-memory segments (each a result in transit)."""
        return self._prefix

    def _submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` on a worker, its result back through shared memory; cancelling the
        returned future cancels the call if it has not started."""
        packed = shm.pack_args(args, self._prefix)
        try:
            call = self._get().submit(_call_packed, self._prefix, fn, packed)
        except BaseException:
            shm.discard(packed)
            raise
        out: Future[T] = Future()
        # ``out`` knows ``call`` weakly: each holding the other in its callbacks made a cycle
        # that kept every result (a block of decoded images) until the garbage collector's
        # next full pass, 300 MiB more resident memory in an image epoch.
        calling = weakref.ref(call)
        out.add_done_callback(functools.partial(_cancel_call, calling))
        call.add_done_callback(lambda c: _unpacked(c, out, packed))
        return out

    def pids(self) -> Sequence[int]:
        if self._executor is None:
            return ()
        return list(self._executor._processes)

    def shutdown(self, timeout_s: float = SHUTDOWN_TIMEOUT_S) -> None:
        """Stop the workers: asked to exit, waited for up to ``timeout_s``, then terminated.
        A start still under way is waited for first (synchronously: a shutdown must not be
        cancellable, or a pool would outlive its run and hold the interpreter's exit)."""
        self._join_starter(timeout_s)
        if self._head_start is not None:
            self._head_start.shutdown(wait=True, cancel_futures=True)
            self._head_start = None
        if self._executor is None:
            return
        executor, self._executor = self._executor, None
        workers = list((executor._processes or {}).values())
        # shutdown() forgets the manager thread and the call queue: keep them first.
        manager = getattr(executor, "_executor_manager_thread", None)
        queue = getattr(executor, "_call_queue", None)
        executor.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + timeout_s
        for worker in workers:
            worker.join(max(0.0, deadline - time.monotonic()))
        stragglers = [w for w in workers if w.is_alive()]
        for worker in stragglers:
            worker.terminate()
        for worker in stragglers:
            worker.join(1.0)
            if worker.is_alive():
                worker.kill()
                worker.join(1.0)
        if stragglers and queue is not None:  # nobody will drain the work queued for them
            queue.cancel_join_thread()
        if manager is not None:  # it notices the workers' end on its own: bounded wait for it
            manager.join(max(1.0, deadline - time.monotonic()))
        shm.sweep(self._prefix)  # results of workers that died before sending them

"""One helper thread that runs the most urgent of its waiting calls first.

A pipeline runs its in-process steps (tokenize, map, filter) on one helper thread, for all
its lanes. The consumer takes batches from the lanes in turn, so the lane that has done the
least is the one it will wait for next; a first-come queue instead let whichever lanes
happened to ask first run ahead, and the last lane's first parts came late (a consumer at
20 ms a batch waited 5-9% of the time during start-up). Each call here carries a key (where
its block starts in its lane's stream), and the thread takes the smallest key next. Only the
order of work changes, never its result.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

__all__ = ["UrgentThread"]


class UrgentThread:
    """A single worker thread taking calls smallest ``key`` first (ties: first come)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._waiting: list[tuple[Any, int, Future[Any], Callable[..., Any], tuple[Any, ...]]] = []
        self._order = itertools.count()
        self._wake = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None

    def __repr__(self) -> str:
        return f"UrgentThread({self._name!r}, waiting={len(self._waiting)})"

    def submit(self, key: Any, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """``fn(*args)`` on the thread, after every waiting call of a smaller ``key``."""
        future: Future[Any] = Future()
        with self._wake:
            if self._closed:
                raise RuntimeError(f"{self._name}: submit after shutdown")
            heapq.heappush(self._waiting, (key, next(self._order), future, fn, args))
            if self._thread is None:
                # A daemon: a pipeline nobody closed never keeps the interpreter alive.
                self._thread = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._thread.start()
            self._wake.notify()
        return future

    def _work(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._closed:
                    self._wake.wait()
                if not self._waiting:
                    return
                _, _, future, fn, args = heapq.heappop(self._waiting)
            if not future.set_running_or_notify_cancel():
                continue  # its caller gave up waiting
            try:
                result = fn(*args)
            except BaseException as exc:  # handed to the caller, as an executor does
                future.set_exception(exc)
            else:
                future.set_result(result)
            del future, fn, args  # no reference to the last call's data while idle

    def at(self, key: Any) -> Executor:
        """An executor for ``loop.run_in_executor`` whose calls all carry ``key``."""
        return _Keyed(self, key)

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new calls, cancel the waiting ones, and (``wait``) let the running one end."""
        with self._wake:
            self._closed = True
            waiting, self._waiting = self._waiting, []
            self._wake.notify_all()
            thread = self._thread
        for entry in waiting:
            entry[2].cancel()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join()


class _Keyed(Executor):
    def __init__(self, thread: UrgentThread, key: Any) -> None:
        self.thread, self.key = thread, key

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if kwargs:
            raise TypeError("UrgentThread calls take positional arguments only")
        return self.thread.submit(self.key, fn, *args)

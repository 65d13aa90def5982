"""Counting gates: the bounded-concurrency primitives of the storage layer.

A :class:`CapacityGate` admits work while the sum of held units stays within a capacity that may
change at run time. It bounds requests in flight (units = requests) and bytes in flight
(units = bytes). Waiters are served first come, first served, so a large request is not starved
by a stream of small ones, and release is synchronous so it is safe in ``finally`` blocks of
cancelled tasks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

__all__ = ["AdaptiveConcurrency", "CapacityGate", "ReadAhead"]

Borrow = Callable[[], bool] | None  # whether an acquire may use what is lent, asked when it waits


class ReadAhead:
    """How far ahead of its consumer a byte budget may fetch: ``seconds`` of what it is seen
    to consume (bytes released per second, averaged over periods of half a second or more),
    never less than ``floor``; no ceiling until the first period has passed (the slow start
    rules the opening).

    A budget is a bound, not a target: a lane whose consumer is slower than its reads (image
    decoding, a training step) filled all of it with fetched bytes waiting their turn, which
    hid no latency the first second's worth did not (images in the main process: 860 MB
    resident at 700 images/s, 680 MB with a quarter of the budget at the same speed). A
    consumer that speeds up raises the ceiling within a period or two: with ``seconds``
    above a read's round trip, the reads in flight always carry more than it consumes."""

    PERIOD_S = 0.5

    def __init__(self, seconds: float, floor: int) -> None:
        self.seconds = seconds
        self.floor = floor
        self.ceiling: int | None = None
        self.rate = 0.0  # bytes per second
        self._since: float | None = None
        self._bytes = 0

    def consumed(self, n: int) -> None:
        now = time.monotonic()
        if self._since is None:
            self._since = now
            return
        self._bytes += n
        elapsed = now - self._since
        if elapsed >= self.PERIOD_S:
            rate = self._bytes / elapsed
            self.rate = rate if self.ceiling is None else (self.rate + rate) / 2
            self.ceiling = max(self.floor, int(self.rate * self.seconds))
            self._since, self._bytes = now, 0


class CapacityGate:
    """Admit ``acquire(n)`` while ``held + n <= capacity``.

    A request larger than the whole capacity is admitted alone (when nothing else is held),
    so an oversized read slows the stream down instead of deadlocking it.
    """

    def __init__(
        self, capacity: int, start: int | None = None, horizon: ReadAhead | None = None
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        # With ``start``, a slow start: the capacity begins there and grows by what the
        # owner reports as used (:meth:`grow`), up to ``capacity``.
        self._limit = capacity
        self._capacity = capacity if start is None else max(1, min(start, capacity))
        self._held = 0
        self._lent = 0  # see lend()
        self._waiters: deque[tuple[int, asyncio.Future[None], Borrow, bool]] = deque()
        self.horizon = horizon

    @property
    def capacity(self) -> int:
        return self._capacity

    @property
    def held(self) -> int:
        return self._held

    def set_capacity(self, capacity: int) -> None:
        self._capacity = self._limit = max(1, capacity)
        self._wake()

    def _fits(self, n: int, borrow: Borrow, whole: bool) -> bool:
        capacity = self._capacity
        if self.horizon is not None and self.horizon.ceiling is not None:
            capacity = min(capacity, self.horizon.ceiling)
        if self._held == 0 or self._held + n <= (self._limit if whole else capacity):
            return True
        lent = self._lent if borrow is not None and self._lent and borrow() else 0
        return self._held + n <= min(self._limit, capacity + lent)

    async def acquire(self, n: int = 1, borrow: Borrow = None, whole: bool = False) -> None:
        """Hold ``n`` units once they fit. What is lent (:meth:`lend`) counts as room while
        ``borrow()`` says so (asked each time the waiter is looked at); with ``whole`` the
        room is the limit, whatever the slow start has reached."""
        if not self._waiters and self._fits(n, borrow, whole):
            self._held += n
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (n, fut, borrow, whole)
        self._waiters.append(entry)
        try:
            await fut
        except BaseException:
            if fut.done() and not fut.cancelled():
                self.release(n)  # granted, then cancelled before we could use it
            else:
                # A release may have dropped the cancelled (so done) future already.
                with contextlib.suppress(ValueError):
                    self._waiters.remove(entry)
                self._wake()
            raise

    def release(self, n: int = 1) -> None:
        self._held -= n
        if self.horizon is not None:
            self.horizon.consumed(n)
        self._wake()

    def grow(self, n: int) -> None:
        """Raise a slow start's capacity by ``n``, up to the limit."""
        if self._capacity < self._limit:
            self._capacity = min(self._limit, self._capacity + n)
            self._wake()

    def lend(self, n: int) -> None:
        """Raise a slow start's capacity by ``n`` for the acquires that ``borrow``, for as
        long as the owner needs (a negative ``n`` gives it back), up to the limit: bytes that
        wait on further work to be of use (a chunk's reads held for the reads of its other
        runs) must not keep that work out, and nothing else may use the room."""
        self._lent = max(0, self._lent + n)
        self._wake()

    def _wake(self) -> None:
        while self._waiters:
            n, fut, borrow, whole = self._waiters[0]
            if fut.done():
                self._waiters.popleft()
                continue
            if not self._fits(n, borrow, whole):
                return
            self._waiters.popleft()
            self._held += n
            fut.set_result(None)

    @asynccontextmanager
    async def hold(self, n: int = 1) -> AsyncIterator[None]:
        await self.acquire(n)
        try:
            yield
        finally:
            self.release(n)


class AdaptiveConcurrency:
    """Additive-increase, multiplicative-decrease control of concurrent requests.

    ``on_throttle`` halves the limit, but only once per generation of requests: a throttle
    reported by a request that started before the last cut says nothing new (it was sent under
    the old limit), so a burst of 503s from one window cuts once, not once per response.
    ``on_success`` adds ``1/limit``, so the limit climbs back by about one per round trip.
    """

    def __init__(self, max_requests: int, min_requests: int = 1) -> None:
        if not 1 <= min_requests <= max_requests:
            raise ValueError(
                f"need 1 <= min_requests <= max_requests, got {min_requests}, {max_requests}"
            )
        self.max_requests = max_requests
        self.min_requests = min_requests
        self._limit = float(max_requests)
        self._last_cut = float("-inf")
        self.gate = CapacityGate(max_requests)
        self.cuts = 0

    @property
    def limit(self) -> int:
        return self.gate.capacity

    def on_success(self) -> None:
        if self._limit < self.max_requests:
            self._limit = min(float(self.max_requests), self._limit + 1.0 / self._limit)
            self.gate.set_capacity(int(self._limit))

    def on_throttle(self, started_at: float) -> None:
        if started_at < self._last_cut:
            return
        self._last_cut = time.monotonic()
        self._limit = max(float(self.min_requests), self._limit / 2.0)
        self.cuts += 1
        self.gate.set_capacity(int(self._limit))

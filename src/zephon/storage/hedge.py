"""Hedged reads: a read far slower than this client's recent reads is sent again, and the first
answer wins.

Object stores have long tails: a request that lands on a slow or stuck server, or a connection
that trickles, can take a thousand times the median; one such read in a block holds up its
lane, then the consumer. An attempt timeout ends it only after minutes. Here, once a read has
run :data:`FACTOR` times the recent 95th percentile (scaled by its size, at least
:data:`FLOOR_S`), the same read goes out again; whichever finishes first is used and the other
is cancelled (its connection closed). Hedges are rationed (:data:`BUDGET` per completed read,
:data:`BUDGET_PER_S` per second), so a slowdown of the whole store cannot double the load on
it, and the percentile follows such a slowdown anyway. Reads are idempotent and pinned to one
version, so two answers are the same bytes.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

__all__ = ["Hedger"]

T = TypeVar("T")

FACTOR = 6.0  # times the recent p95 before a read is sent again
FLOOR_S = 0.5  # never sooner
MIN_SAMPLES = 16  # reads seen before the percentile is used
# Before that: a generous guess, so a stalled first read is not left to the attempt timeout.
UNKNOWN_S = 2.0
UNKNOWN_BYTES_PER_S = 10e6
BUDGET = 0.1  # hedges earned per completed read
BUDGET_PER_S = 1.0  # and per second (a stuck read at the end of a run has no reads to earn by)
MAX_HEDGES = 2  # further copies of one read at most
_MAX_TOKENS = 8.0
_WINDOW = 256
_REFRESH = 32  # reads between recomputing the percentiles


class Hedger:
    """When to send a read again, from the latencies of recent reads (see the module doc)."""

    def __init__(self) -> None:
        self._recent: deque[tuple[float, int]] = deque(maxlen=_WINDOW)
        self._tokens = _MAX_TOKENS / 2
        self._refilled = time.monotonic()
        self._since = 0
        self._p95_s = 0.0
        self._p95_bytes = 1
        self.sent = 0  # hedges sent
        self.won = 0  # hedges that answered first

    def observe(self, latency_s: float, nbytes: int) -> None:
        """A read completed in ``latency_s`` (the winner's time for a hedged one)."""
        self._recent.append((latency_s, nbytes))
        self._tokens = min(_MAX_TOKENS, self._tokens + BUDGET)
        self._since += 1
        if self._since >= _REFRESH or len(self._recent) == MIN_SAMPLES:
            self._since = 0
            latencies = sorted(lat for lat, _ in self._recent)
            sizes = sorted(n for _, n in self._recent)
            at = min(len(latencies) - 1, round(0.95 * (len(latencies) - 1)))
            self._p95_s, self._p95_bytes = latencies[at], max(1, sizes[at])

    def delay_s(self, nbytes: int) -> float:
        """How long a read of ``nbytes`` may run before it is sent again."""
        if len(self._recent) < MIN_SAMPLES:
            return max(UNKNOWN_S, nbytes / UNKNOWN_BYTES_PER_S)
        return max(FLOOR_S, FACTOR * self._p95_s) * max(1.0, nbytes / self._p95_bytes)

    def _take(self) -> bool:
        """Spend a hedge from the budget, if there is one."""
        now = time.monotonic()
        self._tokens = min(_MAX_TOKENS, self._tokens + (now - self._refilled) * BUDGET_PER_S)
        self._refilled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    async def run(self, attempt: Callable[[], Awaitable[T]], nbytes: int) -> T:
        """``attempt()``, sent again each time the attempts in flight have all run past
        :meth:`delay_s` (doubled for each further one; at most :data:`MAX_HEDGES` more, while
        the budget allows); the first to succeed is returned and the rest cancelled. The first
        to fail ends them all with its error (the retry loop tries again, from scratch)."""
        delay = self.delay_s(nbytes)
        pending: set[asyncio.Future[T]] = {asyncio.ensure_future(attempt())}
        first = next(iter(pending))
        hedges = 0
        try:
            while True:
                wait = delay if hedges < MAX_HEDGES else None
                done, pending = await asyncio.wait(
                    pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
                )
                for task in done:
                    if task.exception() is None:
                        if task is not first:
                            self.won += 1
                        return task.result()
                for task in done:
                    raise task.exception()  # type: ignore[misc]
                if self._take():  # all still running, past the delay
                    self.sent += 1
                    hedges += 1
                    pending.add(asyncio.ensure_future(attempt()))
                delay *= 2
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending)

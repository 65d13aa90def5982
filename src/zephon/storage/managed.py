"""ManagedStorage: bounded, retrying, version-pinned reads on top of one backend."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from zephon.errors import (
    ConfigError,
    ObjectChanged,
    StorageError,
    Throttled,
    TransientStorageError,
    TruncatedRead,
    Unreachable,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import Backend
from zephon.storage.diskcache import DiskCache
from zephon.storage.gate import AdaptiveConcurrency, CapacityGate
from zephon.storage.hedge import Hedger
from zephon.storage.keep import ScanKeep
from zephon.storage.policy import RetryPolicy, StorageLimits
from zephon.storage.stats import StorageStats

__all__ = ["ManagedStorage"]

T = TypeVar("T")

UNREACHED_ATTEMPTS = 3  # for an endpoint that never answered and cannot be connected to


class ManagedStorage:
    """The :class:`~zephon.storage.base.Storage` every Zephon component uses.

    Every call passes through, in order: the byte budget (reads only), the adaptive request
    limiter, one backend attempt under a timeout, the length check; transient failures go round
    again after a jittered backoff. Permanent failures (``NotFound``, ``AccessDenied``,
    ``ObjectChanged``) surface at once. It is bound to the event loop that first uses it.

    Args:
        backend: the protocol implementation.
        limits: request and byte bounds.
        retry: the retry policy.
        cache: a local disk cache for version-pinned reads (shared by the node's processes).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        limits: StorageLimits | None = None,
        retry: RetryPolicy | None = None,
        cache: DiskCache | None = None,
    ) -> None:
        self.backend = backend
        self.cache = cache
        self.limits = limits or StorageLimits()
        self.retry = retry or RetryPolicy()
        self.stats = StorageStats()
        self._reached = False  # has the endpoint ever answered?
        self.concurrency = AdaptiveConcurrency(
            self.limits.max_requests, min(self.limits.min_requests, self.limits.max_requests)
        )
        self.budget = CapacityGate(self.limits.max_inflight_bytes)
        self.hedger = Hedger()
        self.keep: ScanKeep | None = None  # a discovery scan's bytes, served before fetching

    def __repr__(self) -> str:
        return f"ManagedStorage({self.backend!r}, limits={self.limits!r})"

    async def __aenter__(self) -> ManagedStorage:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the backend's connections (and let go of kept scan bytes)."""
        if self.keep is not None:
            self.keep.clear()
        await self.backend.aclose()

    @property
    def inflight_bytes(self) -> int:
        """Bytes of reads in flight right now."""
        return self.budget.held

    async def read(
        self, uri: str, start: int = 0, stop: int | None = None, *, version: str | None = None
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``uri``, clipped to the object's end like a slice.

        ``stop=None`` reads to the end (one extra ``stat`` to learn the size). With ``version``,
        the read fails with ``ObjectChanged`` if the object was replaced.

        Raises:
            NotFound, AccessDenied, ObjectChanged: at once.
            TransientStorageError: when every attempt failed.
            ConfigError: a negative or reversed range.
        """
        version = version or None  # "" marks an object whose server gives no version
        if start < 0 or (stop is not None and stop < start):
            raise ConfigError(f"invalid byte range [{start}, {stop}) for {uri}")
        if stop is None:
            info = await self.stat(uri)
            if version is not None and info.version != version:
                raise ObjectChanged("object changed since it was first seen", uri=uri)
            stop = info.size_bytes
            version = version or info.version
        if stop <= start:
            return b""
        kept = None
        if self.keep is not None and version is not None:
            kept = self.keep.take(uri, version, start, stop)
            cut = None if kept is not None else self.keep.kept_tail(uri, version, start, stop)
            if cut is not None:  # the kept bytes end the range: fetch only its head
                tail = self.keep.take(uri, version, cut, stop)
                if tail is not None:
                    return await self.read(uri, start, cut, version=version) + tail
        cache = self.cache if version is not None else None
        if kept is not None and cache is None:
            return kept
        if cache is not None and kept is None:
            assert version is not None
            hit = await asyncio.to_thread(cache.get, uri, version, start, stop)
            if hit is not None:
                return hit
        span = stop - start
        if kept is not None:  # a discovery scan's bytes: into the disk cache for later epochs
            data = kept
        else:
            async with self.budget.hold(min(span, self.limits.max_inflight_bytes)):
                data = await self._retrying(
                    uri, lambda: self._read_once(uri, start, stop, version), hedge_bytes=span
                )
        if cache is not None:
            assert version is not None
            end = start + len(data) if len(data) < span else None  # a short read ends the object
            await asyncio.to_thread(cache.put, uri, version, start, data, end)
        return data

    async def read_object(self, uri: str, guess: int = 1 << 20) -> bytes:
        """The whole object ``uri`` without asking its size first: one read of its first
        ``guess`` bytes, which tells the size, then the rest if it is larger. Each read
        holds its bytes in the budget.

        Raises:
            NotFound, AccessDenied: at once.
            TransientStorageError: when every attempt failed.
        """
        size = [0]

        async def first() -> bytes:
            data, size[0] = await self.backend.get_range(uri, 0, guess, None)
            if len(data) != min(guess, size[0]):
                self.stats.truncated += 1
                raise TruncatedRead(
                    f"body of {len(data)} bytes for the range [0, {guess})", uri=uri
                )
            return data

        async with self.budget.hold(min(guess, self.limits.max_inflight_bytes)):
            head = await self._retrying(uri, first)
        if size[0] <= guess:
            return head
        return head + await self.read(uri, guess, size[0])

    async def _read_once(self, uri: str, start: int, stop: int, version: str | None) -> bytes:
        data, size = await self.backend.get_range(uri, start, stop, version)
        expected = max(0, min(stop, size) - start)
        if len(data) != expected:
            self.stats.truncated += 1
            raise TruncatedRead(
                f"body of {len(data)} bytes where the range [{start}, {stop}) promised {expected}",
                uri=uri,
            )
        return data

    async def stat(self, uri: str) -> ObjectInfo:
        """Size and version of ``uri``. Raises ``NotFound`` if it does not exist."""
        return await self._retrying(uri, lambda: self.backend.head(uri))

    async def write(self, uri: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the whole object ``uri`` (retried; writes are idempotent)."""
        return await self._retrying(uri, lambda: self.backend.put(uri, data))

    async def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix`` in key order; pages are fetched lazily, each retried."""
        token: str | None = None
        while True:
            objects, token = await self._retrying(
                prefix, functools.partial(self.backend.list_page, prefix, token)
            )
            for info in objects:
                yield info
            if token is None:
                return

    async def _retrying(
        self, uri: str, attempt: Callable[[], Awaitable[T]], hedge_bytes: int | None = None
    ) -> T:
        """``attempt`` under the retry policy. An endpoint that has never answered gets
        :data:`UNREACHED_ATTEMPTS` quick attempts when it cannot be reached at all. With
        ``hedge_bytes`` (a read of that many bytes), an attempt far slower than recent reads
        is sent again (:mod:`.hedge`). Throttling is retried for up to the policy's
        ``throttle_timeout_s`` whatever the number of attempts: a storm of 503 SlowDown is
        waited out, at the rate the adaptive limit allows."""
        policy = self.retry
        last: TransientStorageError | None = None
        throttled_since: float | None = None
        n = failed = 0
        while failed < policy.max_attempts:
            if isinstance(last, Unreachable) and not self._reached and n >= UNREACHED_ATTEMPTS:
                break
            if n:
                self.stats.retries += 1
                # Jitter up to 3.2 s at most (by default): a throttled client waits out a storm
                # in short steps, so it notices its end within seconds.
                await asyncio.sleep(policy.delay_s(min(n - 1, 6)))
            started, n = time.monotonic(), n + 1
            try:
                return await self._attempt(uri, attempt, hedge_bytes, started)
            except Throttled as exc:
                last = exc
                throttled_since = throttled_since or started
                if time.monotonic() - throttled_since > policy.throttle_timeout_s:
                    break
            except TransientStorageError as exc:  # Unreachable, a timeout, a 5xx, a reset
                last, failed = exc, failed + 1
        self.stats.failures += 1
        assert last is not None
        last.add_note(f"zephon: gave up after {n} attempts")
        raise last

    async def _attempt(
        self,
        uri: str,
        attempt: Callable[[], Awaitable[T]],
        hedge_bytes: int | None,
        started: float,
    ) -> T:
        """One attempt, in a request slot, under the attempt timeout (hedged for a read);
        its outcome recorded: answered or not, throttled, latency."""
        timeout_s = self.retry.attempt_timeout_s
        async with self.concurrency.gate.hold():
            try:
                async with asyncio.timeout(timeout_s):
                    if hedge_bytes is None:
                        result = await attempt()
                    else:
                        result = await self.hedger.run(attempt, hedge_bytes)
            except TimeoutError:
                raise TransientStorageError(
                    f"attempt timed out after {timeout_s}s", uri=uri
                ) from None
            except Throttled:
                self._reached = True
                self.stats.throttles += 1
                self.concurrency.on_throttle(started)
                raise
            except Unreachable:
                raise
            except StorageError:
                self._reached = True  # it answered, or a connection was made
                raise
        self._reached = True
        self.concurrency.on_success()
        elapsed = time.monotonic() - started
        self.stats.record(elapsed, _size_of(result))
        if hedge_bytes is not None:
            self.hedger.observe(elapsed, hedge_bytes)
        return result


def _size_of(result: Any) -> int:
    return len(result) if isinstance(result, bytes | bytearray | memoryview) else 0

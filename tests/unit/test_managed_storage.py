"""ManagedStorage's policies, against an in-memory backend that fails on a script."""

from __future__ import annotations

import asyncio

import pytest

from zephon.errors import (
    AccessDenied,
    ConfigError,
    NotFound,
    Throttled,
    TransientStorageError,
    TruncatedRead,
)
from zephon.storage import ManagedStorage, MemoryStore, RetryPolicy, StorageLimits
from zephon.storage.memory import MemoryBackend

NO_WAIT = RetryPolicy(max_attempts=5, base_delay_s=0.0)


class ScriptedBackend(MemoryBackend):
    """A memory backend whose next reads fail with the scripted errors, or return short."""

    def __init__(self, store: MemoryStore, script: list[BaseException | str]) -> None:
        super().__init__(store)
        self.script = script
        self.calls = 0

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        self.calls += 1
        data, size = await super().get_range(uri, start, stop, version)
        if self.script:
            step = self.script.pop(0)
            if step == "short":
                return data[:-1], size
            assert isinstance(step, BaseException)
            raise step
        return data, size


@pytest.fixture
def store() -> MemoryStore:
    s = MemoryStore()
    s.put("memory://b/k", b"0123456789")
    return s


async def test_transient_errors_are_retried(store: MemoryStore) -> None:
    backend = ScriptedBackend(
        store,
        [TransientStorageError("reset", uri="u"), Throttled("slow", uri="u"), "short"],
    )
    storage = ManagedStorage(backend, retry=NO_WAIT)
    assert await storage.read("memory://b/k", 2, 6) == b"2345"
    assert backend.calls == 4
    assert storage.stats.retries == 3
    assert storage.stats.throttles == 1
    assert storage.stats.truncated == 1


@pytest.mark.parametrize("error", [NotFound("x", uri="u"), AccessDenied("x", uri="u")])
async def test_permanent_errors_are_not_retried(store: MemoryStore, error: BaseException) -> None:
    backend = ScriptedBackend(store, [error])
    storage = ManagedStorage(backend, retry=NO_WAIT)
    with pytest.raises(type(error)):
        await storage.read("memory://b/k", 0, 4)
    assert backend.calls == 1


async def test_truncation_that_persists_is_reported(store: MemoryStore) -> None:
    backend = ScriptedBackend(store, ["short"] * 5)
    storage = ManagedStorage(backend, retry=NO_WAIT)
    with pytest.raises(TruncatedRead, match="promised 4"):
        await storage.read("memory://b/k", 0, 4)
    assert storage.stats.failures == 1


async def test_short_read_at_the_end_is_not_truncation(store: MemoryStore) -> None:
    storage = ManagedStorage(MemoryBackend(store), retry=NO_WAIT)
    assert await storage.read("memory://b/k", 8, 100) == b"89"
    assert storage.stats.truncated == 0


class BlockingBackend(MemoryBackend):
    """Holds every read until released, so tests can observe what is in flight."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.release = asyncio.Event()
        self.started = 0

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        self.started += 1
        await self.release.wait()
        return await super().get_range(uri, start, stop, version)


async def _settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_byte_budget_bounds_reads_in_flight() -> None:
    store = MemoryStore()
    store.put("memory://b/big", bytes(1000))
    backend = BlockingBackend(store)
    storage = ManagedStorage(backend, limits=StorageLimits(max_requests=64, max_inflight_bytes=250))
    tasks = [
        asyncio.create_task(storage.read("memory://b/big", i * 100, i * 100 + 100))
        for i in range(10)
    ]
    await _settle()
    assert backend.started == 2 and storage.inflight_bytes == 200
    backend.release.set()
    out = await asyncio.gather(*tasks)
    assert out == [bytes(100)] * 10 and storage.inflight_bytes == 0


async def test_request_limit_bounds_requests_in_flight() -> None:
    store = MemoryStore()
    store.put("memory://b/k", bytes(10))
    backend = BlockingBackend(store)
    storage = ManagedStorage(backend, limits=StorageLimits(max_requests=3, min_requests=1))
    tasks = [asyncio.create_task(storage.read("memory://b/k", 0, 1)) for _ in range(10)]
    await _settle()
    assert backend.started == 3
    backend.release.set()
    await asyncio.gather(*tasks)
    assert storage.concurrency.gate.held == 0


async def test_cancelled_reads_release_their_budget() -> None:
    store = MemoryStore()
    store.put("memory://b/k", bytes(10))
    backend = BlockingBackend(store)
    storage = ManagedStorage(backend, limits=StorageLimits(max_requests=2, min_requests=1))
    tasks = [asyncio.create_task(storage.read("memory://b/k", 0, 5)) for _ in range(4)]
    await _settle()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert storage.inflight_bytes == 0 and storage.concurrency.gate.held == 0


async def test_stat_of_missing_object(store: MemoryStore) -> None:
    storage = ManagedStorage(MemoryBackend(store))
    with pytest.raises(NotFound, match="memory://b/none"):
        await storage.stat("memory://b/none")
    info = await storage.stat("memory://b/k")
    assert (info.uri, info.size_bytes) == ("memory://b/k", 10)


def test_policies_validate_arguments() -> None:
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)
    with pytest.raises(ValueError, match="min_requests"):
        StorageLimits(max_requests=2, min_requests=3)
    with pytest.raises(ValueError, match="max_inflight_bytes"):
        StorageLimits(max_inflight_bytes=0)


def test_backoff_is_bounded_and_grows() -> None:
    policy = RetryPolicy(base_delay_s=0.1, max_delay_s=1.0)
    for attempt in range(20):
        assert 0.0 <= policy.delay_s(attempt) <= min(1.0, 0.1 * 2**attempt)


async def test_unknown_scheme_is_a_config_error() -> None:
    from zephon.storage import open_storage

    with pytest.raises(ConfigError, match="ftp"):
        open_storage("ftp://host/x")

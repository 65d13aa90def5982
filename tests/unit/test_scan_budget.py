"""A discovery's scans share one bound on the bytes they have in flight."""

from __future__ import annotations

import asyncio

import pytest

from zephon.dataset import builders
from zephon.errors import NotFound
from zephon.refs import ObjectInfo
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate
from zephon.storage.memory import MemoryBackend, MemoryStore

CHUNK = 1000


class _Counting(MemoryBackend):
    """Counts the bytes of reads under way; each read lets the others run before answering."""

    def __init__(self, store: MemoryStore) -> None:
        super().__init__(store)
        self.inflight = self.most = 0

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        self.inflight += stop - start
        self.most = max(self.most, self.inflight)
        try:
            for _ in range(5):
                await asyncio.sleep(0)  # a yield to the loop, as a network read would
            return await super().get_range(uri, start, stop, version)
        finally:
            self.inflight -= stop - start


async def test_scans_of_many_shards_hold_at_most_the_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(builders, "SCAN_CHUNK_BYTES", CHUNK)
    store = MemoryStore()
    objects = {f"memory://b/s{k}": bytes([k]) * (3 * CHUNK + 17 * k) for k in range(12)}
    infos = [
        ObjectInfo(uri, len(data), store.put(uri, data).version) for uri, data in objects.items()
    ]
    backend = _Counting(store)
    storage = ManagedStorage(backend)
    gate = CapacityGate(3 * CHUNK)
    fed: dict[str, list[bytes]] = {info.uri: [] for info in infos}
    await asyncio.gather(
        *(builders.scan_object(storage, info, fed[info.uri].append, None, gate) for info in infos)
    )
    assert all(b"".join(fed[uri]) == data for uri, data in objects.items())  # in order
    assert backend.most <= 3 * CHUNK  # 12 shards, two chunks each in flight, unbounded: 24
    assert gate.held == 0

    alone = _Counting(store)  # without a gate each shard keeps two chunks in flight
    await asyncio.gather(
        *(builders.scan_object(ManagedStorage(alone), info, lambda _: None) for info in infos)
    )
    assert alone.most > 3 * CHUNK


async def test_a_failed_scan_gives_its_bytes_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(builders, "SCAN_CHUNK_BYTES", CHUNK)
    store = MemoryStore()
    good = ObjectInfo(
        "memory://b/good", 4 * CHUNK, store.put("memory://b/good", b"x" * 4 * CHUNK).version
    )
    gone = ObjectInfo("memory://b/gone", 4 * CHUNK, "v")  # never written: every read fails
    storage = ManagedStorage(MemoryBackend(store))
    gate = CapacityGate(2 * CHUNK)
    with pytest.raises(NotFound):
        await builders.scan_object(storage, gone, lambda _: None, None, gate)
    assert gate.held == 0

    def refuse(data: bytes) -> None:  # the indexer refuses the first chunk (a corrupt tar)
        raise ValueError("corrupt")

    counting = ManagedStorage(_Counting(store))  # the next chunk is read meanwhile
    with pytest.raises(ValueError):
        await builders.scan_object(counting, good, refuse, None, gate)
    assert gate.held == 0
    fed: list[bytes] = []
    await builders.scan_object(storage, good, fed.append, None, gate)  # the budget is whole
    assert b"".join(fed) == b"x" * 4 * CHUNK and gate.held == 0

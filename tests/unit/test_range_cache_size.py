"""The range cache holds what the plan re-reads: it stays small while chunks re-read only recent
ranges, grows when a read needs bytes it dropped, and starts full for a global shuffle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops.fetch import RangeCache
from zephon.pipeline import spec as spec_module
from zephon.storage import ManagedStorage
from zephon.storage.memory import MemoryBackend, MemoryStore

URI = "memory://b/k"


def _storage(size: int) -> tuple[ManagedStorage, str, bytes]:
    store = MemoryStore()
    data = bytes(range(256)) * (size // 256)
    version = store.put(URI, data).version
    return ManagedStorage(MemoryBackend(store)), version, data


async def test_reads_of_recent_ranges_keep_the_cache_at_its_floor() -> None:
    storage, v, data = _storage(64_000)
    cache = RangeCache(capacity_bytes=40_000, floor_bytes=3_000)
    for k in range(50):  # each range read twice in a row, then never again
        a, b = 1000 * k, 1000 * (k + 1)
        assert await cache.read(storage, URI, v, a, b) == data[a:b]
        assert await cache.read(storage, URI, v, a + 200, b) == data[a + 200 : b]
    assert storage.stats.bytes_read == 50_000  # every byte fetched once
    assert cache.hits == 50
    assert cache.size == 3_000 and cache.peak_bytes <= 3_000


async def test_a_read_of_dropped_bytes_grows_the_cache_up_to_its_capacity() -> None:
    storage, v, data = _storage(64_000)
    cache = RangeCache(capacity_bytes=16_000, floor_bytes=2_000)
    ranges = [(1000 * k, 1000 * (k + 1)) for k in range(6)]
    fetched = []
    for _ in range(4):  # six ranges read round and round: each re-read 6,000 bytes later
        before = storage.stats.bytes_read
        for a, b in ranges:
            assert await cache.read(storage, URI, v, a, b) == data[a:b]
        fetched.append(storage.stats.bytes_read - before)
    assert cache.size == 6_000  # what holds the six: the distance of a re-read
    assert fetched[0] == 6_000 and fetched[-1] == 0  # the last rounds are all hits
    assert sum(fetched) <= 2 * 6_000  # what growing cost: at most one more round
    # A longer round grows it again; one no capacity serves leaves it within its capacity.
    for _ in range(3):
        before = storage.stats.bytes_read
        for k in range(14):
            await cache.read(storage, URI, v, 1000 * k, 1000 * k + 1000)
    assert cache.size == 14_000 and storage.stats.bytes_read == before
    for _ in range(3):
        for k in range(40):
            await cache.read(storage, URI, v, 1000 * k, 1000 * k + 1000)
    assert cache.size <= 16_000 and cache.peak_bytes <= 16_000


async def test_a_cache_without_a_floor_is_its_capacity() -> None:
    storage, v, _ = _storage(8_000)
    cache = RangeCache(capacity_bytes=5_000)
    for k in range(8):
        await cache.read(storage, URI, v, 1000 * k, 1000 * (k + 1))
    assert cache.size == 5_000 and cache.peak_bytes == 5_000


def _lines(root: Path, shards: int, per: int) -> int:
    root.mkdir()
    for s in range(shards):
        with (root / f"{s}.jsonl").open("w") as f:
            for i in range(per):
                f.write(json.dumps({"i": s * per + i, "t": "x" * 900}) + "\n")
    return shards * per


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_block_shuffled_epoch_holds_the_floor_and_fetches_what_a_full_cache_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    n = _lines(tmp_path / "d", 6, 4000)  # 22 MB
    ds = Dataset.from_path("d", str(tmp_path / "d"), index_cache=False, keep_scan_bytes=0)

    def epoch() -> dict[str, int]:
        ws = StaticMixtureWorkSource([ds], seed=4, chunk_size=256, stop_after_passes=1)
        pipe = Pipeline(ws, lanes=lanes)
        assert sorted(s["i"] for s in pipe) == list(range(n))
        fetch: dict[str, int] = pipe.stats()["fetch"]
        return fetch

    small = epoch()
    monkeypatch.setattr(spec_module, "RANGE_CACHE_FLOOR", 1 << 40)  # floor = capacity
    full = epoch()
    assert small["cache_size_bytes"] == 8 << 20
    assert small["cache_peak_bytes"] <= 8 << 20 < full["cache_peak_bytes"]
    assert small["bytes"] == full["bytes"]


def test_a_global_shuffle_starts_with_the_whole_cache(tmp_path: Path) -> None:
    n = _lines(tmp_path / "d", 2, 500)
    ds = Dataset.from_path("d", str(tmp_path / "d"), index_cache=False, keep_scan_bytes=0)
    ws = StaticMixtureWorkSource([ds], seed=4, shuffle="global", stop_after_passes=1)
    pipe = Pipeline(ws, lanes=1, range_cache_bytes=32 << 20)
    assert len(list(pipe)) == n
    assert pipe.stats()["fetch"]["cache_size_bytes"] == 32 << 20

"""Reads of neighbouring bytes merge across chunks; shared bytes are fetched once."""

from __future__ import annotations

import asyncio
import pickle
from collections.abc import AsyncIterator

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.formats.index import RecordIndex
from zephon.formats.jsonl import JsonlCodec
from zephon.ops.decode import DecodeJob, decode_job
from zephon.ops.fetch import RangeCache, group_requests, group_reservations
from zephon.refs import Cursor, RangeRequest, ShardInfo
from zephon.storage import ManagedStorage, MemoryStore
from zephon.storage.memory import MemoryBackend

CURSOR = Cursor(0, 0, 0, (0,))


def req(uri: str, start: int, stop: int, dataset: int = 0) -> RangeRequest:
    return RangeRequest(dataset, 0, uri, "v1", ((start, stop),), (0,), (0,), CURSOR, 1)


async def stream(*requests: RangeRequest) -> AsyncIterator[RangeRequest]:
    for r in requests:
        yield r


async def groups(*requests: RangeRequest, gap: int = 10, max_bytes: int = 1000) -> list[list[int]]:
    out = []
    async for group in group_requests(stream(*requests), gap, max_bytes):
        out.append([r.ranges[0][0] for r in group])
    return out


async def test_adjacent_and_repeated_reads_of_a_shard_merge() -> None:
    got = await groups(req("a", 0, 100), req("a", 100, 200), req("a", 100, 200), req("a", 205, 300))
    assert got == [[0], [100, 100], [205]]  # groups start small: 1, then 2, then 4 ...
    got = await groups(req("z", 0, 1), *(req("a", 10 * k, 10 * k + 10) for k in range(12)))
    assert got == [[0], [0, 10], [20, 30, 40, 50], [60, 70, 80, 90, 100, 110]]


async def test_slow_start_admits_one_more_call_per_completion() -> None:
    from zephon.engine.runner import SlowStart

    gate = SlowStart(2, limit=5)

    async def admitted() -> int:  # calls started before the next one would have to wait
        n = 0
        while gate.ready():
            await gate.acquire()
            n += 1
        return n

    assert await admitted() == 2  # two at first
    gate.release()  # one done: its place, and one more
    assert await admitted() == 2
    gate.release()
    gate.release()
    assert await admitted() == 4  # 5 in flight minus the one still running
    gate.release()  # at the limit: a completion only frees its own place
    assert await admitted() == 1


async def test_gaps_other_shards_and_size_bound_split_groups() -> None:
    got = await groups(
        req("a", 0, 100),
        req("a", 150, 200),  # gap 50 > 10
        req("b", 200, 300),  # another shard
        req("b", 300, 1500),  # would exceed max_bytes
    )
    assert got == [[0], [150], [200], [300]]


async def test_reads_going_backwards_do_not_merge() -> None:
    assert await groups(req("a", 500, 600), req("a", 0, 100)) == [[500], [0]]


async def test_range_cache_fetches_shared_bytes_once_and_stays_bounded() -> None:
    store = MemoryStore()
    data = bytes(range(256)) * 40
    v = store.put("memory://b/k", data).version
    w = store.put("memory://b/other", data).version
    storage = ManagedStorage(MemoryBackend(store))
    cache = RangeCache(capacity_bytes=4000)
    read = cache.read
    assert await read(storage, "memory://b/k", v, 100, 2000) == data[100:2000]
    inside = await read(storage, "memory://b/k", v, 500, 1500)
    assert inside == data[500:1500]
    assert isinstance(inside, memoryview)  # a view of the cached read, not a copy of it
    assert await read(storage, "memory://b/k", v, 1800, 2600) == data[1800:2600]  # overlaps
    assert storage.stats.bytes_read == 1900 + 600  # only the new 600 bytes were fetched
    assert cache.hits == 1 and cache.saved_bytes == 1000 + 200
    assert await read(storage, "memory://b/other", w, 500, 600) == data[500:600]  # other object
    assert storage.stats.bytes_read == 2600
    await read(storage, "memory://b/k", v, 5000, 8500)  # 3500 bytes: evicts older ranges
    assert cache._bytes <= 4000


def test_a_group_reserves_the_bytes_it_reads_once_shared_by_its_requests() -> None:
    # four chunks reading the same 700-byte row group, then the next one: one read of 1000
    same = [req("a", 0, 700) for _ in range(4)] + [req("a", 700, 1000)]
    shares = group_reservations(same)
    assert sum(shares) == 1000  # the storage read, not 4 x 700 + 300
    assert shares[:4] == [shares[0]] * 4 and shares[0] > shares[4] > 0
    assert group_reservations([req("a", 10, 60)]) == [50]


def test_decode_jobs_with_views_of_cached_reads_cross_processes() -> None:
    data = b'{"a": 1}\n{"a": 2}\n'
    shard = ShardInfo("memory://b/x.jsonl", 2, len(data), "v1")
    index = RecordIndex(np.array([0, 9, 18], dtype=np.int64))
    job = DecodeJob(JsonlCodec("ds"), shard, index, [(0, memoryview(data))], (1, 0), False)
    sent = pickle.loads(pickle.dumps(job))  # what the process pool does
    assert isinstance(sent.parts[0][1], bytes)
    assert decode_job(sent) == decode_job(job) == ([{"a": 2}, {"a": 1}], [])


async def test_range_cache_fetches_only_the_gaps_around_cached_ranges() -> None:
    store = MemoryStore()
    data = bytes(range(256)) * 40
    v = store.put("memory://b/k", data).version
    storage = ManagedStorage(MemoryBackend(store))
    cache = RangeCache(capacity_bytes=1 << 20)
    assert await cache.read(storage, "memory://b/k", v, 2000, 3000) == data[2000:3000]
    assert await cache.read(storage, "memory://b/k", v, 500, 1000) == data[500:1000]
    # Starts before both cached ranges, spans them and the gap between: fetches the gaps.
    got = await cache.read(storage, "memory://b/k", v, 0, 3500)
    assert got == data[:3500]
    assert storage.stats.bytes_read == 1000 + 500 + (500 + 1000 + 500)
    assert await cache.read(storage, "memory://b/k", v, 100, 3400) == data[100:3400]
    assert storage.stats.bytes_read == 3500  # all cached now


async def test_the_opening_chunks_reads_do_not_wait_for_each_other(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A lane's first chunk interleaves runs of several shards, and its first batch needs a
    read of each: those reads go out together (two at first, by the request slow start),
    not one per round trip as the byte slow start would have them."""
    records = [{"id": i, "text": "x" * 2000} for i in range(8 * 64)]
    ds = Dataset.from_records("r", records, samples_per_shard=64)
    flight: list[int] = [0]
    overlaps: list[tuple[int, int]] = []  # (read, reads in flight when it began)
    real = MemoryBackend.get_range

    async def get_range(
        self: MemoryBackend, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        flight[0] += 1
        overlaps.append((len(overlaps), flight[0]))
        try:
            for _ in range(50):  # turns of the loop in which another read may begin
                await asyncio.sleep(0)
            return await real(self, uri, start, stop, version)
        finally:
            flight[0] -= 1

    monkeypatch.setattr(MemoryBackend, "get_range", get_range)
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    # An in-process map: the lane's byte slow start begins at one read at a time.
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=1).map(len)
    got = [x async for x in pipe]
    assert len(got) == 512
    # The second read began while the first was in flight (alone, with the byte slow start).
    assert overlaps[1][1] == 2, overlaps

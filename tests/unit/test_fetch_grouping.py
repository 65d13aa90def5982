"""Reads of neighbouring bytes merge across chunks; unit reads are fetched once."""

from __future__ import annotations

from collections.abc import AsyncIterator

from zephon.ops.fetch import UnitCache, group_requests
from zephon.refs import Cursor, RangeRequest

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
    assert got == [[0, 100, 100, 205]]


async def test_gaps_other_shards_and_size_bound_split_groups() -> None:
    got = await groups(
        req("a", 0, 100), req("a", 150, 200),  # gap 50 > 10
        req("b", 200, 300),  # another shard
        req("b", 300, 1500),  # would exceed max_bytes
    )  # fmt: skip
    assert got == [[0], [150], [200], [300]]


async def test_reads_going_backwards_do_not_merge() -> None:
    assert await groups(req("a", 500, 600), req("a", 0, 100)) == [[500], [0]]


async def test_unit_cache_fetches_once_and_bounds_its_size() -> None:
    cache = UnitCache(capacity_bytes=10)
    calls = []

    async def fetch_for(key: str) -> list[tuple[int, bytes]]:
        calls.append(key)
        return [(0, key.encode() * 3)]

    for key in ["ab", "ab", "cd", "ab", "ef", "cd"]:
        assert await cache.get(key, lambda k=key: fetch_for(k)) == [(0, key.encode() * 3)]
    # each entry is 6 bytes, so 10 bytes hold one: only the immediate repeat is a hit
    assert calls == ["ab", "cd", "ab", "ef", "cd"]
    assert cache.hits == 1

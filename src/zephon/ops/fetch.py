"""fetch: a lane's range requests become bytes, many in flight, delivered in request order.

The pipeline reserves each request's bytes in its fetch budget *before* starting it and
releases them only when the decoded samples leave the decode stage, so fetched bytes held
anywhere in the pipeline stay within the budget; a slow consumer therefore stops new requests,
which is backpressure all the way to storage.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from zephon.formats.blob import Blob, Bytes
from zephon.plan.coalesce import ReadGroups
from zephon.refs import RangeRequest
from zephon.storage import ManagedStorage

__all__ = [
    "Fetched",
    "RangeCache",
    "group_requests",
    "group_reservations",
    "read_group",
    "read_request",
]

Parts = list[tuple[int, Bytes]]


@dataclass(slots=True)
class Fetched:
    request: RangeRequest
    blob: Blob
    reserved: int


class RangeCache:
    """Recently fetched byte ranges, so that neighbouring chunks fetch shared bytes once.

    Consecutive chunks of a lane often need overlapping ranges: chunks of a mixture cut a
    shuffle window at different places (each coalesced read spans most of the window), and
    Parquet row groups or compressed shards are read whole by every chunk that draws from
    them. A read fully inside a cached range is a view of it (no copy: a row group can be
    megabytes); a read that starts inside one fetches only the rest. Least recently used
    first out.

    The cache holds ``floor_bytes`` and grows towards ``capacity_bytes`` only when the plan
    shows it needs to: a read of bytes the cache dropped (a *ghost*: what a larger cache would
    still have held) grows it to the size that would have kept them. A block-shuffled epoch
    re-reads only recent ranges and stays at the floor (a full cache held bytes no chunk read
    again); a global shuffle re-reads its gaps much later, and starts at the capacity
    (docs/decisions/range-cache-size.md).
    """

    def __init__(self, capacity_bytes: int, floor_bytes: int | None = None) -> None:
        self.capacity = capacity_bytes
        self.size = capacity_bytes if floor_bytes is None else min(floor_bytes, capacity_bytes)
        self._entries: OrderedDict[tuple[str, str, int], bytes] = OrderedDict()
        self._bytes = 0
        self._ghosts: OrderedDict[tuple[str, str, int], int] = OrderedDict()  # key -> length
        self._ghost_bytes = 0
        self._inflight: dict[tuple[str, str, int, int], asyncio.Future[None]] = {}
        self.hits = 0
        self.saved_bytes = 0
        self.peak_bytes = 0

    def _find(self, uri: str, version: str, start: int) -> tuple[int, bytes] | None:
        best: tuple[int, bytes] | None = None
        for (u, v, at), data in reversed(self._entries.items()):
            inside = u == uri and v == version and at <= start < at + len(data)
            if inside and (best is None or at + len(data) > best[0] + len(best[1])):
                best = (at, data)
        return best

    def _put(self, uri: str, version: str, start: int, data: bytes) -> None:
        if not data or len(data) > self.capacity:
            return
        key = (uri, version, start)
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old)
        self._entries[key] = data
        self._bytes += len(data)
        self._shrink()
        self.peak_bytes = max(self.peak_bytes, self._bytes)

    def _shrink(self) -> None:
        """Evicts down to ``size`` (the newest range stays), remembering what left."""
        while self._bytes > self.size and len(self._entries) > 1:
            key, evicted = self._entries.popitem(last=False)
            self._bytes -= len(evicted)
            if self.size < self.capacity:
                self._ghosts[key] = len(evicted)
                self._ghost_bytes += len(evicted)
        while self._ghosts and self._ghost_bytes > self.capacity - self.size:
            self._ghost_bytes -= self._ghosts.popitem(last=False)[1]

    def _missed(self, uri: str, version: str, at: int) -> None:
        """A read of bytes the cache dropped: it grows to what would have held them (the
        bytes it holds, those dropped after them and their own), up to its capacity."""
        newer = 0
        for (u, v, a), length in reversed(self._ghosts.items()):
            if u == uri and v == version and a <= at < a + length:
                del self._ghosts[(u, v, a)]
                self._ghost_bytes -= length
                self.size = min(self.capacity, max(self.size, self._bytes + newer + length))
                self._shrink()  # less room left to grow into: fewer ghosts
                return
            newer += length

    async def read(
        self, storage: ManagedStorage, uri: str, version: str, start: int, stop: int
    ) -> Bytes:
        """Bytes ``[start, stop)``: what cached ranges hold, and only the gaps between them
        fetched (waiting for a fetch in flight that will cover them rather than racing it)."""
        pieces: list[Bytes] = []
        at = start
        fetched = False
        while at < stop:
            for (u, v, a, b), done in list(self._inflight.items()):
                if u == uri and v == version and a <= at < b:
                    await asyncio.shield(done)
                    break
            found = self._find(uri, version, at)
            if found is not None:
                base, data = found
                self._entries.move_to_end((uri, version, base))
                end = min(stop, base + len(data))
                pieces.append(memoryview(data)[at - base : end - base])
                self.saved_bytes += end - at
                at = end
                continue
            gap_end = min(stop, self._next_start(uri, version, at))
            if self._ghosts:
                self._missed(uri, version, at)
            pieces.append(await self._fetch(storage, uri, version, at, gap_end))
            fetched = True
            at = gap_end
        if not fetched:
            self.hits += 1
        return pieces[0] if len(pieces) == 1 else b"".join(pieces)

    def _next_start(self, uri: str, version: str, at: int) -> int:
        """Where the next cached or in-flight range after ``at`` begins (a gap ends there)."""
        starts = [a for (u, v, a) in self._entries if u == uri and v == version and a > at]
        starts += [a for (u, v, a, _) in self._inflight if u == uri and v == version and a > at]
        return min(starts, default=1 << 62)

    async def _fetch(
        self, storage: ManagedStorage, uri: str, version: str, start: int, stop: int
    ) -> Bytes:
        key = (uri, version, start, stop)
        if key in self._inflight:  # the very same range is on its way: share it
            await asyncio.shield(self._inflight[key])
            cached = self._entries.get((uri, version, start))
            if cached is not None and len(cached) >= stop - start:
                self.hits += 1
                self.saved_bytes += stop - start
                return memoryview(cached)[: stop - start]
            return await storage.read(uri, start, stop, version=version)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[key] = done
        try:
            data = await storage.read(uri, start, stop, version=version)
            self._put(uri, version, start, data)
            return data
        finally:
            self._inflight.pop(key, None)
            done.set_result(None)  # waiters look in the cache again (or fetch themselves)


async def _fetch_parts(
    storages: Sequence[ManagedStorage], request: RangeRequest, cache: RangeCache | None
) -> Parts:
    storage = storages[request.dataset]

    async def one(start: int, stop: int) -> Bytes:
        if cache is None:
            return await storage.read(request.uri, start, stop, version=request.version)
        return await cache.read(storage, request.uri, request.version, start, stop)

    if len(request.ranges) == 1:
        ((start, stop),) = request.ranges
        return [(start, await one(start, stop))]
    parts = await asyncio.gather(*(one(a, b) for a, b in request.ranges))
    return [(a, data) for (a, _), data in zip(request.ranges, parts, strict=True)]


async def read_request(
    storages: Sequence[ManagedStorage],
    request: RangeRequest,
    reserved: int,
    cache: RangeCache | None = None,
) -> Fetched:
    """Fetch every range of ``request``, through ``cache`` if given."""
    return Fetched(request, Blob(await _fetch_parts(storages, request, cache)), reserved)


async def group_requests(
    requests: AsyncIterator[RangeRequest], gap_bytes: int, max_bytes: int, max_group: int = 64
) -> AsyncIterator[list[RangeRequest]]:
    """Runs of consecutive single-range requests that read neighbouring bytes of one shard,
    each one storage read (see :class:`~zephon.plan.coalesce.ReadGroups`)."""
    groups = ReadGroups(gap_bytes, max_bytes, max_group)
    try:
        async for request in requests:
            for group in groups.add(request):
                yield group
        for group in groups.finish():
            yield group
    finally:  # closed here, not left to the collector (its aclose would be a stray task)
        aclose = getattr(requests, "aclose", None)
        if aclose is not None:
            await aclose()


def group_reservations(group: list[RangeRequest]) -> list[int]:
    """Budget bytes to reserve for each request of a group from :func:`group_requests`.

    A merged group is one storage read, and its requests often share bytes (consecutive
    chunks of one row group read the same unit): the group reserves the bytes it fetches,
    once, shared out among its requests in proportion to their sizes, so each request
    releases its share when its samples leave decode. Reserving every request's own size
    counted a shared row group once per chunk and starved the fetch concurrency.
    """
    if len(group) == 1:
        return [group[0].nbytes]
    total = max(r.ranges[0][1] for r in group) - group[0].ranges[0][0]
    sizes = [r.nbytes for r in group]
    whole = max(1, sum(sizes))
    shares = [total * size // whole for size in sizes]
    shares[-1] += total - sum(shares)
    return shares


async def read_group(
    storages: Sequence[ManagedStorage],
    group: list[RangeRequest],
    reserved: list[int],
    cache: RangeCache | None = None,
) -> list[Fetched]:
    """Fetch a group from :func:`group_requests`: one storage read for a merged run."""
    if len(group) == 1:
        return [await read_request(storages, group[0], reserved[0], cache)]
    first = group[0]
    start, stop = first.ranges[0][0], max(r.ranges[0][1] for r in group)
    storage = storages[first.dataset]
    data: Bytes
    if cache is None:
        data = await storage.read(first.uri, start, stop, version=first.version)
    else:
        data = await cache.read(storage, first.uri, first.version, start, stop)
    blob = Blob([(start, data)])  # shared: every request slices what it needs, no copies
    return [Fetched(r, blob, res) for r, res in zip(group, reserved, strict=True)]

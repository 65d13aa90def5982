"""fetch: a lane's range requests become bytes, many in flight, delivered in request order.

The pipeline reserves each request's bytes in its fetch budget *before* starting it and
releases them only when the decoded samples leave the decode stage, so fetched bytes held
anywhere in the pipeline stay within the budget; a slow consumer therefore stops new requests,
which is backpressure all the way to storage.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.formats.blob import Blob
from zephon.refs import RangeRequest
from zephon.storage import ManagedStorage

__all__ = ["Fetched", "UnitCache", "group_requests", "read_group", "read_request"]

Parts = list[tuple[int, bytes]]


@dataclass(slots=True)
class Fetched:
    request: RangeRequest
    blob: Blob
    reserved: int


class UnitCache:
    """Recently fetched *unit* reads (a Parquet row group's column chunks, a compressed
    shard), kept so that consecutive chunks needing the same unit fetch it once.

    Record reads are never cached: the planner already makes them dense. Concurrent misses
    for the same unit share one fetch.
    """

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self._entries: OrderedDict[Any, Parts] = OrderedDict()
        self._inflight: dict[Any, asyncio.Future[Parts]] = {}
        self._bytes = 0
        self.hits = 0

    async def get(self, key: Any, fetch: Callable[[], Awaitable[Parts]]) -> Parts:
        parts = self._entries.get(key)
        if parts is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return parts
        pending = self._inflight.get(key)
        if pending is not None:
            self.hits += 1
            return await asyncio.shield(pending)
        future: asyncio.Future[Parts] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            parts = await fetch()
        except BaseException as exc:
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # marked retrieved: waiters re-raise it themselves
            raise
        finally:
            self._inflight.pop(key, None)
        future.set_result(parts)
        size = sum(len(d) for _, d in parts)
        if size <= self.capacity:
            self._entries[key] = parts
            self._bytes += size
            while self._bytes > self.capacity:
                _, old = self._entries.popitem(last=False)
                self._bytes -= sum(len(d) for _, d in old)
        return parts


async def _fetch_parts(storages: Sequence[ManagedStorage], request: RangeRequest) -> Parts:
    storage = storages[request.dataset]
    if len(request.ranges) == 1:
        ((start, stop),) = request.ranges
        return [(start, await storage.read(request.uri, start, stop, version=request.version))]
    parts = await asyncio.gather(
        *(storage.read(request.uri, a, b, version=request.version) for a, b in request.ranges)
    )
    return [(a, data) for (a, _), data in zip(request.ranges, parts, strict=True)]


async def read_request(
    storages: Sequence[ManagedStorage],
    request: RangeRequest,
    reserved: int,
    cache: UnitCache | None = None,
) -> Fetched:
    """Fetch every range of ``request`` (through ``cache`` for unit reads)."""
    if cache is None:
        return Fetched(request, Blob(await _fetch_parts(storages, request)), reserved)
    key = (request.uri, request.version, request.ranges)
    parts = await cache.get(key, lambda: _fetch_parts(storages, request))
    return Fetched(request, Blob(parts), reserved)


async def group_requests(
    requests: AsyncIterator[RangeRequest], gap_bytes: int, max_bytes: int, max_group: int = 64
) -> AsyncIterator[list[RangeRequest]]:
    """Runs of consecutive single-range requests that read neighbouring bytes of one shard.

    The planner coalesces within a chunk; consecutive chunks often continue where the last
    one stopped (storage order, block runs), so one storage read can serve several chunks.
    """
    group: list[RangeRequest] = []
    stop = 0
    async for request in requests:
        if len(request.ranges) == 1:
            ((start, end),) = request.ranges
            if (
                group
                and request.uri == group[0].uri
                and request.version == group[0].version
                and start >= group[0].ranges[0][0]
                and start - stop <= gap_bytes
                and end - group[0].ranges[0][0] <= max_bytes
                and len(group) < max_group
            ):
                group.append(request)
                stop = max(stop, end)
                continue
            if group:
                yield group
            group, stop = [request], end
            continue
        if group:
            yield group
            group = []
        yield [request]
    if group:
        yield group


async def read_group(
    storages: Sequence[ManagedStorage],
    group: list[RangeRequest],
    reserved: list[int],
    cache: UnitCache | None = None,
) -> list[Fetched]:
    """Fetch a group from :func:`group_requests`: one storage read for a merged run."""
    if len(group) == 1:
        return [await read_request(storages, group[0], reserved[0], cache)]
    first = group[0]
    start, stop = first.ranges[0][0], max(r.ranges[0][1] for r in group)
    data = await storages[first.dataset].read(first.uri, start, stop, version=first.version)
    blob = Blob([(start, data)])  # shared: every request slices what it needs, no copies
    return [Fetched(r, blob, res) for r, res in zip(group, reserved, strict=True)]

"""fetch: a lane's range requests become bytes, many in flight, delivered in request order.

The producer reserves each request's bytes in the pipeline's fetch budget *before* starting it
and the budget is released only when the decoded samples leave the decode stage, so fetched
bytes held anywhere in the pipeline stay within the budget; a slow consumer therefore stops
new requests, which is backpressure all the way to storage.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from zephon.engine.channel import Channel
from zephon.formats.blob import Blob
from zephon.refs import RangeRequest
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate

__all__ = ["Fetched", "fetch_requests"]


@dataclass(slots=True)
class Fetched:
    request: RangeRequest
    blob: Blob
    reserved: int


async def _read(
    storages: Sequence[ManagedStorage], request: RangeRequest, reserved: int
) -> Fetched:
    storage = storages[request.dataset]
    if len(request.ranges) == 1:
        ((start, stop),) = request.ranges
        parts = [await storage.read(request.uri, start, stop, version=request.version)]
    else:
        parts = list(
            await asyncio.gather(
                *(
                    storage.read(request.uri, a, b, version=request.version)
                    for a, b in request.ranges
                )
            )
        )
    blob = Blob([(a, data) for (a, _), data in zip(request.ranges, parts, strict=True)])
    return Fetched(request, blob, reserved)


async def fetch_requests(
    requests: AsyncIterator[RangeRequest],
    storages: Sequence[ManagedStorage],
    budget: CapacityGate,
    tg: asyncio.TaskGroup,
    pending: Channel[asyncio.Task[Fetched]],
) -> None:
    """Start a fetch task per request (bounded by ``budget`` and ``pending``'s capacity) and
    hand the tasks, in request order, to ``pending``; closes ``pending`` at the end."""
    try:
        async for request in requests:
            reserved = min(request.nbytes, budget.capacity)
            await budget.acquire(reserved)
            try:
                task = tg.create_task(_read(storages, request, reserved))
            except BaseException:
                budget.release(reserved)
                raise
            await pending.send(task)
    finally:
        pending.close()

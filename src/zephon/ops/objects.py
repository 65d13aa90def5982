"""fetch_field: samples that name another object (a JSONL row with an image key or URL) get
that object's bytes, read through the dataset's own storage client.

Reads run concurrently in the event loop (at most ``limit`` per block in flight, each also
under the storage's request limiter and byte budget), and each costs one request when the
object is at most ``guess`` bytes (:meth:`~zephon.storage.ManagedStorage.read_object`).
A missing object, or a field that names nothing readable, is bad input: a ``FormatError``
naming the dataset, shard and sample, which ``on_error="skip"`` skips and counts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.errors import ConfigError, FormatError, NotFound, first_error, redact_uri
from zephon.ops.block import Block, ref_at
from zephon.ops.operator import LaneContext, StreamOperator
from zephon.storage import ManagedStorage

__all__ = ["FetchField", "fetch_block"]


@dataclass(frozen=True)
class FetchField(StreamOperator):
    """The ``fetch_field`` step: the object named by ``sample[field]`` (a key under
    ``prefix``, by default the dataset's root, or a URI in the same store) read into
    ``sample[out]``; ``inflight`` reads per block at a time, two blocks at a time, one
    request each for objects up to ``guess`` bytes."""

    name: ClassVar[str] = "fetch_field"
    per_item: ClassVar[bool] = True

    field: str
    out: str
    prefix: str | None = None
    guess: int = 1 << 20
    inflight: int = 32

    def __post_init__(self) -> None:
        if self.inflight < 1 or self.guess < 1:
            raise ConfigError("fetch_field needs inflight >= 1 and guess_bytes >= 1")

    def label(self) -> str:  # how many reads are in flight changes nothing
        return f"fetch_field({self.field!r}, out={self.out!r}, prefix={self.prefix!r})"

    async def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        """Two blocks' reads in flight, delivered in order."""
        pending: deque[asyncio.Task[Block]] = deque()
        try:
            async for block in blocks:
                read = fetch_block(
                    self, block, lane.storages, lane.datasets, self.inflight, lane.on_skip
                )
                pending.append(asyncio.ensure_future(read))
                if len(pending) == 2:
                    yield await pending.popleft()
            while pending:
                yield await pending.popleft()
        finally:
            for task in pending:  # the run is ending: what they would read is not wanted
                task.cancel()
                task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def uri(self, sample: Any, root: str) -> str:
        """The URI ``sample`` names, resolved against ``prefix`` or the dataset's ``root``."""
        value = sample.get(self.field) if isinstance(sample, dict) else None
        if not isinstance(value, str) or not value:
            got = type(value).__name__ if isinstance(sample, dict) else type(sample).__name__
            raise FormatError(f"field {self.field!r} holds {got}, not an object key or URI")
        base = self.prefix or root
        if "://" in value:
            if value.split("://", 1)[0] != base.split("://", 1)[0]:
                raise FormatError(
                    f"field {self.field!r} names {redact_uri(value)}, outside the "
                    f"dataset's store ({redact_uri(base)})"
                )
            return value
        return base.rstrip("/") + "/" + value.lstrip("/")


async def fetch_block(
    step: FetchField,
    block: Block,
    storages: Sequence[ManagedStorage],
    datasets: Sequence[Any],
    limit: int,
    on_skip: Callable[[Any, str], None] | None,
) -> Block:
    """``block`` with each sample's object read into it (in order), weighing their bytes as
    well; samples whose object is missing are dropped and reported to ``on_skip`` when
    given, else raise."""
    gate = asyncio.Semaphore(limit)
    provenance = block.provenance()

    async def one(pos: int, item: Any) -> Any:
        ref = ref_at(provenance, pos)
        d, shard, sample = ref[:3]
        ds = datasets[d]
        try:
            uri = step.uri(item, ds.root)
            async with gate:
                try:
                    data = await storages[d].read_object(uri, step.guess)
                except NotFound:
                    raise FormatError(
                        f"field {step.field!r} names {redact_uri(uri)}, which does not exist"
                    ) from None
        except FormatError as exc:
            where = f"dataset {ds.name!r}, shard {ds.shards[shard].uri}, sample {sample}"
            if on_skip is None:
                raise FormatError(f"{exc} ({where})") from None
            on_skip(ref, f"{step.label()}: {exc}")
            return None
        return {**item, step.out: data}

    try:
        async with asyncio.TaskGroup() as tg:
            tasks = [tg.create_task(one(pos, item)) for pos, item in enumerate(block.items)]
    except BaseExceptionGroup as group:  # the first sample's error, as for any other step
        raise first_error(group) from None
    results = [t.result() for t in tasks]
    out = block.kept([r is not None for r in results], [r for r in results if r is not None])
    out.nbytes += sum(len(r[step.out]) for r in results if r is not None)  # channels weigh it
    return out

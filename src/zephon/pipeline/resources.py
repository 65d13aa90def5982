"""What the stages of a run share (:class:`Resources`), and the channel and receive helpers
every stage uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from zephon.engine.channel import Channel
from zephon.engine.pool import WorkerPool
from zephon.engine.raypool import RayPool
from zephon.engine.runner import timed_receive
from zephon.engine.stats import StageStats
from zephon.engine.urgent import UrgentThread
from zephon.errors import FormatError
from zephon.ops.block import Block
from zephon.ops.decode import SkipLedger
from zephon.ops.fetch import RangeCache
from zephon.pipeline.spec import PipelineSpec
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate

__all__ = ["LANE_CHANNEL", "Resources", "block_channel", "counted"]

T = TypeVar("T")

LANE_CHANNEL = 4  # blocks buffered between two stages of a lane (fewer if they are large)


@dataclass
class Resources:
    """What a run's stages share: storage clients, the fetch byte budget (a share per lane:
    the merge takes lanes in turn, so a lane holding the whole budget would starve the one
    it waits for), the range cache, the worker pool, the skip ledger and the stage counters."""

    storages: list[ManagedStorage]
    budgets: dict[int, CapacityGate]
    range_cache: RangeCache | None
    pool: WorkerPool | None
    ledger: SkipLedger
    datasets: list[Any] = field(default_factory=list)  # the work source's, to name skips
    stages: dict[str, StageStats] = field(default_factory=dict)
    encoder: UrgentThread | None = None
    remote: dict[Any, RayPool] = field(default_factory=dict)  # per Ray executor, its actors
    # Per lane, set when it may start fetching (absent: at once); see ``Run`` (start order).
    starts: dict[int, asyncio.Event] = field(default_factory=dict)
    channels: list[Channel[Any]] = field(default_factory=list)  # emptied when the run ends

    def track(self, channel: Channel[T]) -> Channel[T]:
        """``channel``, to be emptied when the run ends (:meth:`discard`)."""
        self.channels.append(channel)
        return channel

    def lane_channel(
        self, spec: PipelineSpec, on_take: Callable[[Block], None] | None = None
    ) -> Channel[Block]:
        """A channel between two stages of a lane (:func:`block_channel` of
        ``LANE_CHANNEL`` blocks), emptied when the run ends."""
        return self.track(block_channel(LANE_CHANNEL, spec, on_take))

    def discard(self) -> None:
        """Drop what the run's channels still buffer. A cancelled run's frames stay alive in
        reference cycles (a task group's exceptions and their tracebacks) until a full
        garbage collection; its buffered blocks should not stay with them."""
        for channel in self.channels:
            channel.discard()

    def pool_for(self, executor: Any) -> Any:
        """Where a step's blocks go: its Ray actors, or the pipeline's process pool."""
        return self.pool if executor is None else self.remote[executor]

    def stats(self, name: str, concurrency: str = "1") -> StageStats:
        """A new stage's counters, registered under ``name``."""
        self.stages[name] = stats = StageStats(name, concurrency)
        return stats

    def encoder_thread(self) -> UrgentThread:
        """The run's helper thread for in-process steps (made on first use), all lanes'
        work on it taken most urgent first."""
        self.encoder = self.encoder or UrgentThread("zephon-encode")
        return self.encoder

    def _where(self, ref: Any) -> tuple[str, str, int] | None:
        """``(dataset name, shard URI, sample)`` of a ref (a batch's or packed sequence's:
        its first sample), or ``None`` if it names no sample of this run's datasets."""
        while isinstance(ref, list) and ref:
            ref = ref[0]
        if not (isinstance(ref, tuple) and len(ref) == 4 and self.datasets):
            return None
        ds = self.datasets[ref[0]]
        return ds.name, ds.shards[ref[1]].uri, int(ref[2])

    def name_sample(self, exc: FormatError) -> None:
        """Put the dataset's name, the shard's URI and the sample's index in the message of
        bad input a step raised (it knew the sample only as indices: ``zephon_ref``)."""
        where = self._where(getattr(exc, "zephon_ref", None))
        if exc.dataset is not None or where is None:
            return
        named = FormatError(exc.message, dataset=where[0], uri=where[1], sample=where[2])
        exc.dataset, exc.uri, exc.sample = named.dataset, named.uri, named.sample
        exc.args = named.args

    def skipped(self, ref: Any, message: str) -> None:
        """Record a sample a step skipped under ``on_error="skip"`` (``ref``: its
        ``(dataset, shard, sample, pass)``, or the refs of a batch or packed sequence)."""
        where = self._where(ref)
        if where is not None:
            self.ledger.add(*where, message)
        else:
            self.ledger.add("?", "?", -1, f"{message} (at {ref!r})")


def block_channel(
    capacity: int, spec: PipelineSpec, on_take: Callable[[Block], None] | None = None
) -> Channel[Block]:
    """A channel of at most ``capacity`` blocks and about ``spec.block_bytes``."""
    return Channel(capacity, spec.block_bytes, _weight, on_take)


def _weight(block: Block) -> int:
    return block.nbytes


async def counted(source: Channel[Block], stats: StageStats) -> AsyncIterator[Block]:
    """Blocks from ``source``, counted in and timed as waits of the stage."""
    while True:
        try:
            block = await timed_receive(source, stats)
        except StopAsyncIteration:
            return
        stats.items_in += len(block.items)
        yield block

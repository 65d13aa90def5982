"""One running instance of a pipeline: its resources, its task group, its counters.

A run's ``_main`` task owns a single :class:`asyncio.TaskGroup` holding every stage of every
lane plus the merge; the consumer reads :attr:`Run.output` from outside the group, so no
generator ever yields inside it. A failure anywhere closes the output with the root error.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import time
from typing import Any

import numpy as np

from zephon.engine.channel import Channel
from zephon.engine.pool import WorkerPool
from zephon.engine.raypool import RayPool
from zephon.engine.runner import first_error, spawn, start_stage
from zephon.errors import ConfigError
from zephon.ops.block import Block
from zephon.ops.decode import SkipLedger
from zephon.ops.fetch import RangeCache
from zephon.ops.itemops import Tokenize
from zephon.ops.merge import merge_lanes
from zephon.pipeline.graph import build_lane
from zephon.pipeline.resources import Resources, block_channel
from zephon.pipeline.spec import PipelineSpec
from zephon.pipeline.state import Received, Resume, merge_start
from zephon.storage import DiskCache, ManagedStorage
from zephon.storage.gate import CapacityGate, ReadAhead

__all__ = ["Run"]

_CALIBRATION_SAMPLES = 512  # samples tokenized to measure a dataset's tokens per byte
# A lane fetches at most a second of what it consumes ahead, and at least four reads' worth
# (storage.gate.ReadAhead): the fetch budget bounds it, it is not a target.
READ_AHEAD_S = 1.0
READ_AHEAD_FLOOR_READS = 4


class Run:
    """One iteration of a pipeline, from :meth:`start` until its output is drained or
    :meth:`stop` cancels it."""

    def __init__(self, spec: PipelineSpec, resume: Resume, received: Received) -> None:
        self.spec = spec
        self.resume = resume
        self.received = received  # the consumer's state at the start (for the merge turn)
        self.output = block_channel(spec.prefetch_blocks, spec)
        self.task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.res: Resources | None = None
        self.stall_s = 0.0
        self.delivered = 0
        self.started = 0.0

    @property
    def storages(self) -> list[ManagedStorage]:
        return self.res.storages if self.res is not None else []

    @property
    def pool(self) -> WorkerPool | None:
        return self.res.pool if self.res is not None else None

    async def start(self) -> None:
        if self.spec.pool_size() and multiprocessing.current_process().daemon:
            raise ConfigError(
                "processes=N needs worker processes, which a daemonic process cannot start (a "
                "DataLoader worker is one): inside DataLoader(num_workers=W) use processes=0 "
                "(its workers are the processes), or keep processes=N with num_workers=0"
            )
        self.loop = asyncio.get_running_loop()
        self.started = time.perf_counter()
        self.task = asyncio.create_task(self._main(), name="zephon-pipeline")

    async def stop(self) -> None:
        """Cancel the run and wait until every task, worker and connection is released."""
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        # What the consumer will never take goes now, not at the next full garbage
        # collection: the task's exception holds the frames that hold this run (a cycle),
        # and the pipeline keeps its last run for stats().
        self.task = None
        self.output.discard()

    def stop_threadsafe(self) -> None:
        if self.loop is not None and self.task is not None and not self.task.done():
            self.loop.call_soon_threadsafe(self.task.cancel)

    async def _main(self) -> None:
        spec = self.spec
        size = spec.pool_size()
        cache = DiskCache(spec.cache_dir, spec.cache_limit_bytes) if spec.cache_dir else None
        self.res = res = Resources(
            storages=[
                d.open_storage(limits=spec.limits, retry=spec.retry, cache=cache)
                for d in spec.source.datasets
            ],
            budgets={},
            range_cache=(
                RangeCache(spec.range_cache_capacity, spec.range_cache_floor)
                if spec.range_cache_bytes
                else None
            ),
            pool=WorkerPool(size) if size else None,
            ledger=SkipLedger(spec.max_skipped),
            datasets=list(spec.source.datasets),
            remote={executor: RayPool(executor) for executor in spec.remote_executors()},
        )
        res.budgets.update(_budgets(spec, res))
        for remote in res.remote.values():
            remote.prestart()
        if res.pool is not None:
            res.pool.start_soon(spec.step_modules())
        try:
            try:
                await calibrate(spec, res.storages)
            except Exception as exc:
                self.output.close(exc)
                return
            async with asyncio.TaskGroup() as tg:
                first, ended = merge_start(spec, self.received)
                order = _start_order(spec, first, ended) if self.resume.lanes else []
                res.starts.update((lane, asyncio.Event()) for lane in order[1:])
                outs = [
                    build_lane(
                        tg, spec, res, lane, self.resume.lanes.get(lane), self.resume.history
                    )
                    for lane in spec.my_lanes
                ]
                position = {lane: i for i, lane in enumerate(spec.my_lanes)}
                for before, lane in itertools.pairwise(order):
                    spawn(tg, _start_after(outs[position[before]], res.starts[lane]))
                stats = res.stats("merge")
                body = merge_lanes(
                    outs,
                    self.output,
                    stats,
                    spec.deterministic,
                    first,
                    ended,
                    list(spec.my_lanes),
                    spec.block_bytes,
                )
                start_stage(tg, "merge", stats, body)
        except BaseExceptionGroup as group:
            self.output.close(first_error(group))
        finally:
            self.output.close()
            res.discard()
            await self._release(res)

    @staticmethod
    async def _release(res: Resources) -> None:
        if res.pool is not None:  # idle by now; shutting down takes milliseconds
            pool, res.pool = res.pool, None
            pool.shutdown()  # waits for a start under way
        for remote in res.remote.values():
            remote.close()
        if res.encoder is not None:  # at most one block's encoding to finish
            encoder, res.encoder = res.encoder, None
            encoder.shutdown(wait=True)
        for storage in res.storages:
            await storage.aclose()

    def data_bytes(self) -> int:
        """Bytes of data this run has read: fetched, or served from what discovery's scan
        kept (a scanned JSONL dataset's first epoch fetches nothing more)."""
        kept = sum(s.keep.served_bytes for s in self.storages if s.keep)
        return sum(s.stats.bytes_read for s in self.storages) + kept

    def stats(self) -> dict[str, Any]:
        """Counters of this run: per stage, fetch, consumer, skipped samples."""
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        fetch: dict[str, Any] = {
            "requests": 0,
            "bytes": 0,
            "retries": 0,
            "throttles": 0,
            "truncated": 0,
            "inflight_bytes": 0,
            "hedges": 0,
            "hedges_won": 0,
        }
        latencies: list[float] = []
        for storage in self.storages:
            s = storage.stats
            fetch["requests"] += s.requests
            fetch["bytes"] += s.bytes_read
            fetch["retries"] += s.retries
            fetch["throttles"] += s.throttles
            fetch["truncated"] += s.truncated
            fetch["inflight_bytes"] += storage.inflight_bytes
            fetch["hedges"] += storage.hedger.sent
            fetch["hedges_won"] += storage.hedger.won
            latencies.extend(s._latencies_s)
        res = self.res
        cache = res.range_cache if res is not None else None
        fetch["cache_hits"] = cache.hits if cache is not None else 0
        fetch["cache_saved_bytes"] = cache.saved_bytes if cache is not None else 0
        fetch["cache_size_bytes"] = cache.size if cache is not None else 0
        fetch["cache_peak_bytes"] = cache.peak_bytes if cache is not None else 0
        fetch["scan_reused_bytes"] = sum(s.keep.served_bytes for s in self.storages if s.keep)
        fetch["scan_spilled_bytes"] = sum(s.keep.spilled_bytes for s in self.storages if s.keep)
        disk = self.storages[0].cache if self.storages else None
        if disk is not None:  # one DiskCache shared by the run's storages
            fetch["disk_cache"] = {
                "hits": disk.stats.hits,
                "misses": disk.stats.misses,
                "hit_bytes": disk.stats.hit_bytes,
                "written_bytes": disk.stats.written_bytes,
                "evicted_bytes": disk.stats.evicted_bytes,
            }
        latencies.sort()
        for q in (50, 99):
            fetch[f"p{q}_latency_s"] = (
                latencies[min(len(latencies) - 1, round(q / 100 * (len(latencies) - 1)))]
                if latencies
                else None
            )
        return {
            "elapsed_s": elapsed,
            "delivered": self.delivered,
            "consumer_stall_s": self.stall_s,
            "stages": {name: st.as_dict() for name, st in (res.stages if res else {}).items()},
            "fetch": fetch,
            "skipped": [
                {"dataset": d, "shard": u, "sample": s, "error": e}
                for d, u, s, e in (res.ledger.skipped if res else [])
            ],
        }


async def calibrate(spec: PipelineSpec, storages: list[ManagedStorage]) -> None:
    """Measure the tokens-per-byte ratio of token-mixture datasets that lack one, with the
    pipeline's tokenizer, on the first samples of up to eight evenly spaced shards.
    Deterministic, so every rank measures the same ratios; from then on they belong to the
    curriculum and are frozen into checkpoints."""
    source = spec.source
    missing = set(source.uncalibrated())
    if not missing:
        return
    at = next((i for i, op in enumerate(spec.steps) if isinstance(op, Tokenize)), None)
    if at is None:
        source._ratios()  # raises: says what to do
        return
    tokenize, before = spec.steps[at], spec.steps[:at]
    if any(op.run_now([]) is None for op in before):  # an op that only a run can run
        raise ConfigError(
            "cannot measure tokens_per_byte through an async map/filter or apply() before "
            "tokenize(): pass tokens_per_byte to the work source"
        )
    ratios: dict[str, float] = {}
    for d, ds in enumerate(source.datasets):
        if ds.name not in missing:
            continue
        shards = sorted({int(x) for x in np.linspace(0, len(ds.shards) - 1, 8)})
        per_shard = max(1, _CALIBRATION_SAMPLES // len(shards))
        samples: list[Any] = []
        nbytes = 0.0
        for shard in shards:
            picks = list(range(min(per_shard, ds.shards[shard].num_samples)))
            samples.extend(await ds.aread(storages[d], shard, picks))
            nbytes += float(
                source.manifests[d]
                .sample_nbytes(np.full(len(picks), shard), np.array(picks, np.int64))
                .sum()
            )
        for op in before:  # the steps before tokenize, as the pipeline runs them
            samples = op.run_now(samples) or []
        # Bytes of every sample planned, tokens of those that reach the tokenizer: the
        # tokens a planned byte yields on average.
        encoded = (tokenize.run_now(samples) or []) if samples else []
        tokens = sum(len(s["input_ids"]) for s in encoded)
        ratios[ds.name] = max(tokens, 1) / max(nbytes, 1.0)
    source.calibrate(ratios)


def _budgets(spec: PipelineSpec, res: Resources) -> dict[int, CapacityGate]:
    """Each lane's share of the fetch budget, with its slow start; hands each storage client
    the scanned bytes kept for the first epoch (they count in the budget)."""
    # Scanned bytes kept for the first epoch (up to half the budget) count in the fetch
    # budget; the rest is shared out between this rank's lanes.
    kept = 0
    for storage, dataset in zip(res.storages, spec.source.datasets, strict=True):
        keep = storage.keep = dataset.take_scan_keep()
        if keep is not None:
            keep.trim(spec.fetch_budget_bytes // 2 - kept)
            kept += keep.held
    share = max(1, (spec.fetch_budget_bytes - kept) // max(1, len(spec.my_lanes)))
    # A lane whose items go through work in this process after decoding (a map, a
    # tokenizer on the helper thread) starts its share at one read at a time (a gate admits
    # a read larger than its capacity alone) and grows it by what its first step takes from
    # assembly: at start-up its first items' work has the machine to itself, and a slow
    # consumer never pays for a read-ahead it does not use. (Starting at one request's
    # worth, 8 MiB, let each lane fetch and decode four or five chunks while the consumer
    # waited for its second batch: stall.py, 100 ms steps, 1.7-5.4% waiting; now 0.3-0.7%.)
    # Other lanes start at a request's worth: when decoding is all the work, or the work
    # runs in worker processes, the slower ramp only starves it (a plain JSONL epoch 10-20%
    # slower, peers.py; images in 2 workers: first batch 1.44 -> 1.97 s, images.py).
    in_process = any(op.per_item and not op.processes and op.executor is None for op in spec.steps)
    elsewhere = spec.decode_processes > 0 or any(s.processes or s.executor for s in spec.steps)
    start = 1 if in_process and not elsewhere else spec.source.max_request_bytes
    floor = min(share, READ_AHEAD_FLOOR_READS * spec.source.max_request_bytes)
    return {
        lane: CapacityGate(share, start, ReadAhead(READ_AHEAD_S, floor)) for lane in spec.my_lanes
    }


def _start_order(spec: PipelineSpec, first: int, ended: list[int]) -> list[int]:
    """After a restore, the lanes in the order the merge first takes from them (from the one
    whose turn it is); each starts fetching once the one before it has a block ready. Each
    lane replays its stateful steps' windows (a shuffle's, a pack's row), which costs far
    more than a fresh lane's first items; in turn, the first batch waits for one replay, not
    for all of them sharing the machine (3.7x a fresh start's first batch with four lanes,
    1.1x in turn). A fresh start needs little per lane, and starting every lane at once keeps
    the batches after the first from waiting. Empty when the merge takes whichever lane is
    ready (``deterministic=False``)."""
    if not spec.deterministic:
        return []
    live = [i for i in range(len(spec.my_lanes)) if i not in set(ended)]
    if first in live:
        at = live.index(first)
        live = live[at:] + live[:at]
    return [spec.my_lanes[i] for i in live]


async def _start_after(lane_out: Channel[Block], start: asyncio.Event) -> None:
    """Set ``start`` once ``lane_out`` has a block (or has ended)."""
    try:
        await lane_out.ready()
    finally:
        start.set()

"""Pipeline: the builder, the running graph, and the sync bridge."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import operator
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import compress
from typing import Any

import numpy as np

from zephon.engine.channel import Channel, closing
from zephon.engine.pool import WorkerPool
from zephon.engine.runner import first_error, ordered, stage, timed_receive, timed_send
from zephon.engine.stats import StageStats
from zephon.errors import ConfigError, StateMismatch
from zephon.ops.batch import batch_blocks
from zephon.ops.block import Block, ChunkRows, Mark
from zephon.ops.decode import ChunkAssembler, DecodeJob, SkipLedger, decode_job, is_failed
from zephon.ops.fetch import Fetched, RangeCache, group_requests, group_reservations, read_group
from zephon.ops.merge import merge_lanes
from zephon.ops.pack import pack_blocks
from zephon.ops.shuffle import shuffle_blocks
from zephon.ops.transform import apply_block, run_apply
from zephon.plan import StaticMixtureWorkSource
from zephon.refs import Cursor, RangeRequest
from zephon.storage import ManagedStorage, RetryPolicy, StorageLimits
from zephon.storage.gate import CapacityGate

__all__ = ["Pipeline"]

_LANE_CHANNEL = 4  # blocks buffered between two stages of a lane
_STATEFUL = ("shuffle", "pack", "apply")
_CALIBRATION_SAMPLES = 512  # samples tokenized to measure a dataset's tokens per byte


@dataclass(frozen=True)
class _Op:
    kind: str  # "map" | "filter" | "apply" | "batch"
    fn: Any = None
    processes: int = 0
    size: int = 0
    drop_last: bool = False

    def label(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__) if self.fn is not None else ""
        if self.kind == "batch":
            return f"batch({self.size}, drop_last={self.drop_last})"
        if self.kind == "shuffle":
            return f"shuffle(buffer_size={self.size}, seed={self.fn})"
        if self.kind == "pack":
            seq_len, algorithm, pad_id, field, window = self.fn
            return (
                f"pack({seq_len}, {algorithm}, pad_id={pad_id}, field={field!r}, window={window})"
            )
        if self.kind == "tokenize":
            t = self.fn
            where = f"{self.processes} processes" if self.processes else "in process"
            return (f"tokenize({t.kind}, field={t.field!r}, max_length={t.max_length}, "
                    f"bos={t.bos}, eos={t.eos}; {where})")  # fmt: skip
        where = f"{self.processes} processes" if self.processes else "in process"
        return f"{self.kind}({name}; {where})"


def _default_rank() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except ImportError:
        pass
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


class Pipeline:
    """Fetches a work source's range requests and runs operators over the samples.

    Args:
        source: the curriculum (its datasets must be :class:`~zephon.dataset.Dataset`).
        rank, world_size: this process's place; default from ``torch.distributed`` or the
            ``RANK``/``WORLD_SIZE`` environment.
        lanes: logical streams (default ``world_size``); must be a multiple of ``world_size``.
            Rank ``r`` owns lanes ``[r * lanes / world_size, (r + 1) * lanes / world_size)``.
        deterministic: ``False`` delivers in completion order instead of curriculum order.
        on_error: ``"raise"``, or ``"skip"`` samples that fail to decode (counted, listed in
            ``stats()``) up to ``max_skipped``.
        fetch_budget_bytes: fetched bytes held in the pipeline at most.
        max_inflight_requests: reads in flight per lane at most.
        limits, retry: storage client bounds and retry policy.
        decode_processes: decode in a worker pool of this size (``0``: in process).
        prefetch: blocks of output kept ready for the consumer.
        range_cache_bytes: recently fetched ranges kept so that neighbouring chunks fetch
            shared bytes once (see :class:`~zephon.ops.fetch.RangeCache`); ``0`` disables.

    Raises:
        ConfigError: invalid arguments.
    """

    def __init__(
        self,
        source: StaticMixtureWorkSource,
        rank: int | None = None,
        world_size: int | None = None,
        lanes: int | None = None,
        *,
        deterministic: bool = True,
        on_error: str = "raise",
        max_skipped: int = 1000,
        fetch_budget_bytes: int = 256 << 20,
        max_inflight_requests: int = 64,
        limits: StorageLimits | None = None,
        retry: RetryPolicy | None = None,
        decode_processes: int = 0,
        prefetch: int = 4,
        range_cache_bytes: int = 64 << 20,
    ) -> None:
        if rank is None or world_size is None:
            env_rank, env_world = _default_rank()
            rank = env_rank if rank is None else rank
            world_size = env_world if world_size is None else world_size
        lanes = world_size if lanes is None else lanes
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(
                f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}"
            )
        if lanes < 1 or lanes % world_size:
            raise ConfigError(
                f"lanes ({lanes}) must be a positive multiple of world_size ({world_size})"
            )
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        for name, value in (("fetch_budget_bytes", fetch_budget_bytes),
                            ("max_inflight_requests", max_inflight_requests),
                            ("prefetch", prefetch)):  # fmt: skip
            if value < 1:
                raise ConfigError(f"{name} must be >= 1, got {value}")
        if decode_processes < 0:
            raise ConfigError(f"decode_processes must be >= 0, got {decode_processes}")
        datasets = getattr(source, "datasets", None)
        if not datasets or any(not hasattr(d, "codec") for d in datasets):
            raise ConfigError("the work source's datasets must be discovered Dataset objects")
        self.source = source
        self.rank, self.world_size, self.lanes = rank, world_size, lanes
        self.deterministic = deterministic
        self.on_error = on_error
        self.max_skipped = max_skipped
        self.fetch_budget_bytes = fetch_budget_bytes
        self.max_inflight_requests = max_inflight_requests
        self.limits = limits or StorageLimits(max_inflight_bytes=fetch_budget_bytes)
        self.retry = retry
        self.decode_processes = decode_processes
        self.prefetch_blocks = prefetch
        self.range_cache_bytes = range_cache_bytes
        self._ops: tuple[_Op, ...] = ()
        self._resume: dict[int, dict[str, Any]] = {}
        self._received = _Received()
        self._torch: bool | None = None  # None: numpy out; else tensors, pinned if True
        self._last: _Run | None = None
        self._runs: weakref.WeakSet[_Run] = weakref.WeakSet()

    # -- building ---------------------------------------------------------------------

    def _with(self, op: _Op | None = None, **changes: Any) -> Pipeline:
        new = object.__new__(Pipeline)
        new.__dict__.update(self.__dict__)
        new._ops = self._ops + ((op,) if op is not None else ())
        new._last = None
        new._runs = weakref.WeakSet()
        new._resume, new._received = {}, _Received()
        for key, value in changes.items():
            setattr(new, key, value)
        return new

    def _check_after_batch(self, what: str) -> None:
        if any(op.kind == "batch" for op in self._ops):
            raise ConfigError(f"{what} after batch() is not supported; put it before batch()")

    def map(self, fn: Callable[[Any], Any], processes: int = 0) -> Pipeline:
        """``fn(sample) -> sample | None`` (sync or async; ``None`` drops the sample). With
        ``processes=N``, ``fn`` must be a picklable top-level function; it runs in the
        pipeline's worker pool, a block at a time, with identical output."""
        if processes < 0:
            raise ConfigError(f"processes must be >= 0, got {processes}")
        if processes and asyncio.iscoroutinefunction(fn):
            raise ConfigError("an async function cannot run in the process pool")
        return self._with(_Op("map", fn, processes))

    def filter(self, pred: Callable[[Any], Any], processes: int = 0) -> Pipeline:
        """Keep samples for which ``pred(sample)`` is true (sync or async)."""
        if processes < 0:
            raise ConfigError(f"processes must be >= 0, got {processes}")
        if processes and asyncio.iscoroutinefunction(pred):
            raise ConfigError("an async predicate cannot run in the process pool")
        return self._with(_Op("filter", pred, processes))

    def apply(self, op: Callable[[AsyncIterator[Any]], AsyncIterator[Any]]) -> Pipeline:
        """A custom operator: ``op(stream) -> stream``, an async generator over items.

        Runs per lane and resumes exactly from checkpoints. An op with ``state() -> dict``
        (JSON) and ``restore(dict)`` is stateful: each lane of each run works on its own deep
        copy, ``state()`` is taken after every output (it must describe everything the op
        holds at that point, and be cheap). Any other op must be stateless: each output
        depends only on the latest input taken (a filter or flat-map), so on resume that
        input is fed again and the outputs already delivered are skipped.
        """
        return self._with(_Op("apply", op))

    def batch(self, size: int, drop_last: bool = False) -> Pipeline:
        """Collate ``size`` samples per batch (per lane) into a dict of columns."""
        if size < 1:
            raise ConfigError(f"batch size must be >= 1, got {size}")
        self._check_after_batch("batch")
        return self._with(_Op("batch", size=size, drop_last=drop_last))

    def shuffle(self, buffer_size: int = 8192, seed: int | None = None) -> Pipeline:
        """Permute each lane's items within consecutive windows of ``buffer_size``; keyed by
        (seed, lane, window start), so it is deterministic and resumes exactly without
        saving buffered items. ``seed`` defaults to the work source's seed."""
        if buffer_size < 1:
            raise ConfigError(f"buffer_size must be >= 1, got {buffer_size}")
        self._check_after_batch("shuffle")
        chosen = self.source.seed if seed is None else seed
        return self._with(_Op("shuffle", chosen, size=buffer_size))

    def tokenize(
        self,
        tokenizer: Any,
        field: str = "text",
        max_length: int | None = None,
        bos: bool | int = True,
        eos: bool | int = True,
        processes: int = 0,
    ) -> Pipeline:
        """Add ``input_ids`` (int32) from ``sample[field]``, batch-encoding each block; see
        :class:`~zephon.ops.tokenize.Tokenize` for the accepted tokenizers."""
        from zephon.ops.tokenize import Tokenize

        self._check_after_batch("tokenize")
        return self._with(_Op("tokenize", Tokenize(tokenizer, field, max_length, bos, eos),
                              processes))  # fmt: skip

    def pack(
        self,
        seq_len: int,
        algorithm: str = "concat",
        pad_id: int = 0,
        field: str = "input_ids",
        window: int = 1024,
    ) -> Pipeline:
        """Rows of exactly ``seq_len`` tokens with ``input_ids``, ``positions`` and
        ``segment_ids``; ``algorithm`` is ``concat`` (no token lost), ``first_fit`` or
        ``best_fit`` (over windows of ``window`` documents, padded with ``pad_id``)."""
        from zephon.ops.pack import PACK_ALGORITHMS

        if seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {seq_len}")
        if algorithm not in PACK_ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {PACK_ALGORITHMS}, got {algorithm!r}")
        if window < 1:
            raise ConfigError(f"window must be >= 1, got {window}")
        self._check_after_batch("pack")
        return self._with(_Op("pack", (seq_len, algorithm, pad_id, field, window)))

    def to_torch(self, pin_memory: bool = False) -> Pipeline:
        """Deliver numpy arrays as torch tensors (the ``torch`` extra); after ``batch`` too."""
        try:
            import torch  # noqa: F401
        except ImportError:
            raise ConfigError("to_torch() needs torch: pip install 'zephon[torch]'") from None
        return self._with(_torch=pin_memory)

    def to_torch_dataset(self, pin_memory: bool = False) -> Any:
        """This pipeline as a torch ``IterableDataset`` with ``state_dict``/``load_state_dict``
        (for ``DataLoader(batch_size=None)`` and torchdata's ``StatefulDataLoader``)."""
        try:
            from zephon.torch import ZephonIterableDataset
        except ImportError:
            raise ConfigError(
                "to_torch_dataset() needs torch: pip install 'zephon[torch]'"
            ) from None
        return ZephonIterableDataset(self, pin_memory)

    def prefetch(self, blocks: int) -> Pipeline:
        """Keep up to ``blocks`` blocks of output ready ahead of the consumer."""
        if blocks < 1:
            raise ConfigError(f"prefetch must be >= 1, got {blocks}")
        return self._with(prefetch_blocks=blocks)

    def decode(self, processes: int = 0) -> Pipeline:
        """Decode shards in a worker pool of ``processes`` (``0``: in the event loop)."""
        if processes < 0:
            raise ConfigError(f"processes must be >= 0, got {processes}")
        return self._with(decode_processes=processes)

    # -- introspection ----------------------------------------------------------------

    @property
    def my_lanes(self) -> range:
        per = self.lanes // self.world_size
        return range(self.rank * per, (self.rank + 1) * per)

    def explain(self) -> str:
        """The planned stages and their concurrency, as text."""
        ws = self.source
        names = ", ".join(f"{d.name} ({d.format}, {d.num_samples} samples)" for d in ws.datasets)
        lines = [
            f"source: StaticMixtureWorkSource[{names}] shuffle={ws.shuffle} "
            f"chunk_size={ws.chunk_size} passes={ws.stop_after_passes} "
            f"policy={ws.exhausted_policy}",
            f"rank {self.rank}/{self.world_size}: lanes {list(self.my_lanes)} of {self.lanes}, "
            "each:",
            f"  plan -> fetch (<= {self.max_inflight_requests} reads in flight, shared budget "
            f"{self.fetch_budget_bytes / 2**20:.0f} MiB, storage <= {self.limits.max_requests} "
            "requests)",
            "  -> decode ("
            + (f"{self.decode_processes} processes" if self.decode_processes else "in process")
            + (", skip bad samples" if self.on_error == "skip" else "")
            + ")",
        ]
        lines += [f"  -> {op.label()}" for op in self._ops]
        order = "round-robin" if self.deterministic else "completion order"
        lines.append(
            f"merge lanes ({order}) -> prefetch({self.prefetch_blocks} blocks) -> consumer"
        )
        return "\n".join(lines)

    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) run: per stage, fetch, consumer, skipped."""
        run = self._last
        if run is None:
            return {}
        return run.stats()

    # -- checkpoints ------------------------------------------------------------------

    def _identity(self) -> dict[str, Any]:
        return {
            "source": self.source.describe(),
            "lanes": self.lanes,
            "ops": [op.label() for op in self._ops],
            "on_error": self.on_error,
        }

    def checkpoint(self) -> dict[str, Any]:
        """JSON state of what the consumer has received, for this rank's lanes.

        Small (a cursor per lane) and free of pickles. Any rank's checkpoint, or
        :meth:`merge_checkpoints` of several, restores on any world size with the same lanes.

        A custom ``apply`` op is resumed exactly if it is stateless (each output depends only
        on the latest input) or implements ``state() -> dict`` (JSON) and ``restore(dict)``.
        """
        received = self._received
        received.settle()
        lanes: dict[str, Any] = {}
        for lane in self.my_lanes:
            entry: dict[str, Any] = {"items": received.items.get(lane, 0),
                                     "ended": lane in received.ended}  # fmt: skip
            if lane in received.position:
                _, cursor, delivered, ops = received.position[lane]
                entry["cursor"] = cursor.to_dict() if cursor is not None else None
                entry["delivered"] = delivered
                entry["ops"] = list(ops)
            elif lane in self._resume:
                entry.update({k: v for k, v in self._resume[lane].items() if k != "items"})
            lanes[str(lane)] = entry
        return {"zephon_checkpoint": 1, **self._identity(), "lane_states": lanes}

    @staticmethod
    def merge_checkpoints(states: list[dict[str, Any]]) -> dict[str, Any]:
        """One checkpoint from the checkpoints of several ranks (their lanes together)."""
        if not states:
            raise ConfigError("merge_checkpoints needs at least one checkpoint")
        merged = dict(states[0])
        merged["lane_states"] = {}
        for state in states:
            merged["lane_states"].update(state.get("lane_states", {}))
        return merged

    def restore(self, state: dict[str, Any]) -> None:
        """Continue, on the next iteration, exactly after what ``state`` records as received.

        Reads only this rank's lanes. Raises ``StateMismatch`` naming what differs when the
        checkpoint belongs to another pipeline (datasets, seed, lanes, operators...).
        """
        if not isinstance(state, dict) or state.get("zephon_checkpoint") != 1:
            raise StateMismatch("not a Zephon pipeline checkpoint")
        ours = self._identity()
        diffs = []
        for key in ("lanes", "ops", "on_error"):
            if state.get(key) != ours[key]:
                diffs.append(
                    f"{key}: checkpoint has {state.get(key)!r}, this pipeline has {ours[key]!r}"
                )
        if diffs:
            raise StateMismatch("checkpoint does not match this pipeline: " + "; ".join(diffs))
        self._adopt_ratios(state.get("source"))
        lanes = state.get("lane_states", {})
        resume: dict[int, dict[str, Any]] = {}
        items: dict[int, int] = {}
        ended: set[int] = set()
        for lane in self.my_lanes:
            entry = lanes.get(str(lane))
            if entry is None:
                continue
            items[lane] = int(entry.get("items", 0))
            if entry.get("ended"):
                ended.add(lane)
            if "delivered" in entry:
                cursor = Cursor.from_dict(entry["cursor"]) if entry.get("cursor") else None
                lane_state = None
                if cursor is not None:
                    lane_state = self.source.state(cursor, int(entry["delivered"]), self.lanes)
                    lane_state["describe"] = state["source"]  # checked by the source
                    self.source.check_state(lane_state, self.lanes)
                elif state["source"] != self.source.describe():
                    raise StateMismatch("checkpoint was taken from a different work source")
                ops = tuple(x if isinstance(x, dict) else int(x) for x in entry.get("ops", ()))
                if len(ops) != sum(op.kind in _STATEFUL for op in self._ops):
                    raise StateMismatch("checkpoint's operator states do not match the chain")
                resume[lane] = {"cursor": entry.get("cursor"), "delivered": entry["delivered"],
                                "ops": list(ops), "state": lane_state,
                                "mark": (lane, cursor, int(entry["delivered"]), ops)}  # fmt: skip
        self._resume, self._received = resume, _Received(items, frozenset(ended))

    def _adopt_ratios(self, theirs: Any) -> None:
        """Take the checkpoint's measured tokens-per-byte ratios (frozen at its first run)
        for the datasets this source would otherwise measure."""
        missing = self.source.uncalibrated()
        if not missing or not isinstance(theirs, dict):
            return
        names = [name for name, _ in theirs.get("datasets", [])]
        ratios = theirs.get("tokens_per_byte")
        if names != self.source.names or not isinstance(ratios, list):
            return  # a different curriculum: the checks that follow say how
        self.source.calibrate(
            {n: r for n, r in zip(names, ratios, strict=True) if n in missing and r is not None}
        )

    def _merge_start(self) -> tuple[int, list[int]]:
        """Position of the lane whose turn it is, and positions of lanes known to have ended."""
        mine = list(self.my_lanes)
        received = self._received
        ended = [i for i, lane in enumerate(mine) if lane in received.ended]
        live = [i for i in range(len(mine)) if i not in ended]
        if not live:
            return 0, ended
        fewest = min(received.items.get(mine[i], 0) for i in live)
        first = next(i for i in live if received.items.get(mine[i], 0) == fewest)
        return first, ended

    # -- running ----------------------------------------------------------------------

    def _pool_size(self) -> int:
        return max([self.decode_processes, *(op.processes for op in self._ops)])

    async def _blocks(self, progress: bool) -> AsyncGenerator[Block, None]:
        """Run the pipeline, yielding a block at a time."""
        run = _Run(self)
        self._last = run
        self._runs.add(run)
        if self._resume:  # a restored start: counts carry on from the checkpoint
            self._received = _Received(self._received.items, self._received.ended)
        else:
            self._received = _Received()
        bar = _ProgressBar(run) if progress else None
        await run.start()
        try:
            while True:
                started = time.perf_counter()
                try:
                    block = await run.output.receive()
                except StopAsyncIteration:
                    break
                run.stall_s += time.perf_counter() - started
                run.delivered += len(block.items)
                if bar is not None:
                    bar.advance(len(block.items))
                yield block
        finally:
            if bar is not None:
                bar.close()
            await run.stop()

    async def _aiter(self, progress: bool) -> AsyncIterator[Any]:
        async with contextlib.aclosing(self._blocks(progress)) as blocks:
            async for block in blocks:
                received = self._received  # a run starts afresh: read it once it has
                for item in received.open(block, self._out(block.items)):
                    yield item  # the checkpoint is what the consumer has received

    def _out(self, items: list[Any]) -> list[Any]:
        if self._torch is None:
            return items
        from zephon.torch import to_tensors

        return [to_tensors(item, self._torch) for item in items]

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._aiter(progress=False)

    def aiter(self, progress: bool = False) -> AsyncIterator[Any]:
        """Async iteration, optionally with a progress bar."""
        return self._aiter(progress)

    def __iter__(self) -> Iterator[Any]:
        return self.iter()

    def iter(self, progress: bool = False) -> Iterator[Any]:
        """Iterate from synchronous code: the pipeline runs on a background event loop (uvloop
        when installed); blocks cross threads, items are yielded here. Breaking out or closing
        the iterator stops the pipeline and releases every task, connection and worker."""
        bridge = _Bridge(self, progress)
        try:
            yield from bridge
        finally:
            bridge.close()

    async def aclose(self) -> None:
        """Stop every running iteration of this pipeline."""
        for run in list(self._runs):
            await run.stop()

    def close(self) -> None:
        """Stop every running iteration started from synchronous code."""
        for run in list(self._runs):
            run.stop_threadsafe()


class _Received:
    """What the consumer has received, per lane: the last mark and the item count of each.

    The consumer takes the open block's items from the iterator :meth:`open` returns, so how
    many it has received is how far that iterator has got; the open block's marks are folded in
    when the next block opens or a checkpoint is taken, so delivery costs nothing per item.
    """

    __slots__ = ("_left", "_size", "block", "ended", "items", "position", "settled")

    def __init__(self, items: dict[int, int] | None = None, ended: frozenset[int] = frozenset()):
        self.position: dict[int, Mark] = {}
        self.items: dict[int, int] = dict(items or {})
        self.ended = ended
        self.block: Block | None = None
        self.settled = 0
        self._left: Iterator[Any] = iter(())
        self._size = 0

    def open(self, block: Block, items: list[Any]) -> Iterator[Any]:
        """Start handing out ``block`` (its ``items``, converted for the consumer)."""
        self.settle()
        self.block, self.settled = block, 0
        self._left, self._size = iter(items), len(items)
        return self._left

    @property
    def taken(self) -> int:
        """Items of the open block handed to the consumer."""
        return self._size - operator.length_hint(self._left)

    def settle(self) -> None:
        block = self.block
        if block is None or self.taken == self.settled:
            return
        if block.lane >= 0:  # one lane's block: its last received mark says it all
            lane = block.lane
            self.position[lane] = block.mark(self.taken - 1)
            self.items[lane] = self.items.get(lane, 0) + self.taken - self.settled
            self.ended = block.extra.get("ended", self.ended)
            self.settled = self.taken
            return
        for lane, (n, mark) in block.progress(self.settled, self.taken).items():
            self.position[lane] = mark
            self.items[lane] = self.items.get(lane, 0) + n
        self.ended = block.extra.get("ended", self.ended)
        self.settled = self.taken


class _Run:
    """One running instance of a pipeline: its task group lives in ``self.task``."""

    def __init__(self, pipe: Pipeline) -> None:
        self.pipe = pipe
        self.output: Channel[Block] = Channel(pipe.prefetch_blocks)
        self.task: asyncio.Task[None] | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stages: dict[str, StageStats] = {}
        self.storages: list[ManagedStorage] = []
        self.ledger = SkipLedger(pipe.max_skipped)
        self.pool: WorkerPool | None = None
        self.encoder: ThreadPoolExecutor | None = None
        self.range_cache: RangeCache | None = None
        self.stall_s = 0.0
        self.delivered = 0
        self.started = 0.0

    def _stats(self, name: str, concurrency: str = "1") -> StageStats:
        stats = StageStats(name, concurrency)
        self.stages[name] = stats
        return stats

    async def start(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.started = time.perf_counter()
        self.task = asyncio.create_task(self._main(), name="zephon-pipeline")

    async def stop(self) -> None:
        task = self.task
        if task is not None and not task.done():
            task.cancel()
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stop_threadsafe(self) -> None:
        if self.loop is not None and self.task is not None and not self.task.done():
            self.loop.call_soon_threadsafe(self.task.cancel)

    async def _main(self) -> None:
        pipe = self.pipe
        datasets = pipe.source.datasets
        self.storages = [d.open_storage(limits=pipe.limits, retry=pipe.retry) for d in datasets]
        size = pipe._pool_size()
        self.pool = WorkerPool(size) if size else None
        budget = CapacityGate(pipe.fetch_budget_bytes)
        self.range_cache = RangeCache(pipe.range_cache_bytes) if pipe.range_cache_bytes else None
        try:
            try:
                await self._calibrate()
            except Exception as exc:
                self.output.close(exc)
                return
            async with asyncio.TaskGroup() as tg:
                outs = [self._lane(tg, lane, budget) for lane in pipe.my_lanes]
                first, ended = pipe._merge_start()
                stats = self._stats("merge")
                tg.create_task(
                    stage(
                        "merge",
                        stats,
                        merge_lanes(
                            outs,
                            self.output,
                            stats,
                            pipe.deterministic,
                            first,
                            ended,
                            list(pipe.my_lanes),
                        ),
                    )
                )
        except BaseExceptionGroup as group:
            self.output.close(first_error(group))
        finally:
            self.output.close()
            if self.pool is not None:  # idle by now; shutting down takes milliseconds
                pool, self.pool = self.pool, None
                pool.shutdown()
            if self.encoder is not None:  # at most one block's encoding to finish
                encoder, self.encoder = self.encoder, None
                encoder.shutdown(wait=True)
            for storage in self.storages:
                await storage.aclose()

    def _encoder(self) -> ThreadPoolExecutor:
        """The run's thread for tokenizers that release the GIL (made on first use)."""
        if self.encoder is None:
            self.encoder = ThreadPoolExecutor(1, thread_name_prefix="zephon-encode")
        return self.encoder

    async def _calibrate(self) -> None:
        """Measure the tokens-per-byte ratio of token-mixture datasets that lack one, with
        the pipeline's tokenizer, on the first samples of up to eight evenly spaced shards.
        Deterministic, so every rank measures the same ratios; from then on they belong to
        the curriculum and are frozen into checkpoints."""
        source = self.pipe.source
        missing = set(source.uncalibrated())
        if not missing:
            return
        at = next((i for i, op in enumerate(self.pipe._ops) if op.kind == "tokenize"), None)
        if at is None:
            source._ratios()  # raises: says what to do
            return
        tok, before = self.pipe._ops[at].fn, self.pipe._ops[:at]
        if any(op.kind == "apply" or inspect.iscoroutinefunction(op.fn) for op in before
               if op.kind in ("apply", "map", "filter")):  # fmt: skip
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
                samples.extend(await ds.aread(self.storages[d], shard, picks))
                nbytes += float(
                    source.manifests[d]
                    .sample_nbytes(np.full(len(picks), shard), np.array(picks, np.int64))
                    .sum()
                )
            for op in before:  # the steps before tokenize, as the pipeline runs them
                if op.kind == "map":
                    samples = [y for y in map(op.fn, samples) if y is not None]
                elif op.kind == "filter":
                    samples = [x for x in samples if op.fn(x)]
            # Bytes of every sample planned, tokens of those that reach the tokenizer: the
            # tokens a planned byte yields on average.
            tokens = sum(len(s["input_ids"]) for s in tok.batch(samples)) if samples else 0
            ratios[ds.name] = max(tokens, 1) / max(nbytes, 1.0)
        source.calibrate(ratios)

    def _lane(self, tg: asyncio.TaskGroup, lane: int, budget: CapacityGate) -> Channel[Block]:
        pipe = self.pipe
        datasets = pipe.source.datasets
        resume = pipe._resume.get(lane)
        requests = pipe.source.requests(
            lane, pipe.lanes, resume=resume["state"] if resume is not None else None
        )
        resume_mark: Mark | None = resume["mark"] if resume is not None else None

        async def read(group: list[RangeRequest]) -> list[Fetched]:
            # One reservation for the group's storage read (admitted alone if it exceeds the
            # budget); each request releases its share once decoded.
            reserved = group_reservations(group)
            await budget.acquire(sum(reserved))
            try:
                return await read_group(self.storages, group, reserved, self.range_cache)
            except BaseException:
                budget.release(sum(reserved))
                raise

        groups = group_requests(
            requests, pipe.source.coalesce_gap_bytes, pipe.source.max_request_bytes
        )
        fetched: Channel[list[Fetched]] = Channel(pipe.max_inflight_requests)
        fetch_stats = self._stats(f"fetch[{lane}]", str(pipe.max_inflight_requests))
        tg.create_task(
            stage(f"fetch[{lane}]", fetch_stats,
                  ordered(tg, groups, read, fetched, pipe.max_inflight_requests, fetch_stats,
                          deterministic=pipe.deterministic, size=len))
        )  # fmt: skip

        def job(f: Fetched) -> DecodeJob:
            r = f.request
            ds = datasets[r.dataset]
            return DecodeJob(ds.codec, ds.shards[r.shard], ds.indexes[r.shard], f.blob.parts,
                             r.samples, pipe.on_error == "skip")  # fmt: skip

        decoded: Channel[tuple[Fetched, list[Any], list[tuple[int, str]]]] = Channel(
            max(2, pipe.decode_processes * 2)
        )
        decode_stats = self._stats(f"decode[{lane}]", str(pipe.decode_processes or 1))
        if pipe.decode_processes:
            pool = self.pool
            assert pool is not None

            async def decode_remote(f: Fetched) -> tuple[Fetched, list[Any], list[tuple[int, str]]]:
                items, failed = await pool.run(f"decode[{lane}]", decode_job, job(f))
                return f, items, failed

            body = ordered(tg, _flatten(fetched), decode_remote, decoded,
                           pipe.decode_processes * 2, decode_stats,
                           deterministic=pipe.deterministic)  # fmt: skip
        else:

            async def decode_local() -> None:
                with closing(decoded):
                    while True:
                        try:
                            group = await timed_receive(fetched, decode_stats)
                        except StopAsyncIteration:
                            return
                        for f in group:
                            decode_stats.items_in += 1
                            items, failed = decode_job(job(f))
                            decode_stats.items_out += 1
                            await timed_send(decoded, (f, items, failed), decode_stats)

            body = decode_local()
        tg.create_task(stage(f"decode[{lane}]", decode_stats, body))

        chunks: Channel[Block] = Channel(_LANE_CHANNEL)
        assemble_stats = self._stats(f"assemble[{lane}]")
        assemble = self._assemble(lane, decoded, chunks, budget, assemble_stats)
        tg.create_task(stage(f"assemble[{lane}]", assemble_stats, assemble))
        current = chunks
        depth = 0
        for i, op in enumerate(pipe._ops):
            nxt: Channel[Block] = Channel(_LANE_CHANNEL)
            name = f"{op.kind}#{i}[{lane}]"
            st = self._stats(name, str(op.processes or 1))
            op_resume = None
            if op.kind in _STATEFUL:
                if resume_mark is not None:
                    lane_, cursor, delivered, ops = resume_mark
                    op_resume = ((lane_, cursor, delivered, ops[:depth]), ops[depth])
                body = self._stateful(op, lane, current, nxt, st, depth, op_resume)
                depth += 1
            else:
                body = self._op(tg, op, lane, current, nxt, st, name)
            tg.create_task(stage(name, st, body))
            current = nxt
        return current

    async def _assemble(
        self,
        lane: int,
        decoded: Channel[tuple[Fetched, list[Any], list[tuple[int, str]]]],
        out: Channel[Block],
        budget: CapacityGate,
        stats: StageStats,
    ) -> None:
        datasets = self.pipe.source.datasets
        ready: list[Block] = []

        def emit(items: list[Any], rows: ChunkRows, failed: bool) -> None:
            if failed:  # drop the placeholders of samples skipped under on_error="skip"
                keep = [not is_failed(x) for x in items]
                marks = rows.marks()
                block = Block(lane, list(compress(items, keep)), list(compress(rows.refs(), keep)),
                              list(compress(marks, keep)))  # fmt: skip
                if marks:
                    block.extra["last_mark"] = marks[-1]
            else:
                block = Block(lane, items, rows=rows)
            ready.append(block)

        assembler = ChunkAssembler(lane, emit)
        with closing(out):
            while True:
                try:
                    f, items, failed = await timed_receive(decoded, stats)
                except StopAsyncIteration:
                    break
                budget.release(f.reserved)
                r = f.request
                stats.items_in += 1
                for pos, message in failed:
                    ds = datasets[r.dataset]
                    self.ledger.add(ds.name, r.uri, int(r.samples[pos]), message)
                if self.pipe.deterministic:
                    assembler.add(r.cursor, r.slots, items, r.dataset, r.shard, r.samples,
                                  bool(failed))  # fmt: skip
                else:
                    n = len(r.samples)
                    rows = ChunkRows(lane, r.cursor, np.full(n, r.dataset), np.full(n, r.shard),
                                     r.samples, r.slots + 1)  # fmt: skip
                    emit(items, rows, bool(failed))
                while ready:
                    block = ready.pop(0)
                    stats.items_out += len(block.items)
                    await timed_send(out, block, stats)
            assembler.flush()
            for block in ready:
                stats.items_out += len(block.items)
                await timed_send(out, block, stats)

    async def _op(
        self,
        tg: asyncio.TaskGroup,
        op: _Op,
        lane: int,
        source: Channel[Block],
        out: Channel[Block],
        stats: StageStats,
        name: str,
    ) -> None:
        if op.kind in ("map", "filter", "tokenize") and op.processes:
            pool = self.pool

            async def one(block: Block) -> Block:
                return await apply_block(op.kind, op.fn, block, pool, name)

            await ordered(tg, source, one, out, op.processes, stats,
                          deterministic=self.pipe.deterministic, size=len)  # fmt: skip
            return
        with closing(out):
            if op.kind in ("map", "filter", "tokenize"):
                executor = self._encoder() if op.kind == "tokenize" else None
                async for block in _counted(source, stats):
                    result = await apply_block(op.kind, op.fn, block, None, name, executor)
                    stats.items_out += len(result.items)
                    await timed_send(out, result, stats)
            else:
                stream = batch_blocks(_counted(source, stats), op.size, op.drop_last, lane)
                async for block in stream:
                    stats.items_out += len(block.items)
                    await timed_send(out, block, stats)

    async def _stateful(
        self,
        op: _Op,
        lane: int,
        source: Channel[Block],
        out: Channel[Block],
        stats: StageStats,
        depth: int,
        resume: tuple[Mark, Any] | None,
    ) -> None:
        with closing(out):
            if op.kind == "shuffle":
                stream = shuffle_blocks(
                    _counted(source, stats), op.size, op.fn, lane, depth, resume
                )
            elif op.kind == "apply":
                stream = run_apply(op.fn, _counted(source, stats), lane, depth, resume)
            else:
                seq_len, algorithm, pad_id, field, window = op.fn
                stream = pack_blocks(_counted(source, stats), seq_len, algorithm, pad_id, field,
                                     lane, depth, resume, window)  # fmt: skip
            async for block in stream:
                stats.items_out += len(block.items)
                await timed_send(out, block, stats)

    def stats(self) -> dict[str, Any]:
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        fetch: dict[str, Any] = {"requests": 0, "bytes": 0, "retries": 0, "throttles": 0,
                                 "truncated": 0, "inflight_bytes": 0}  # fmt: skip
        latencies: list[float] = []
        for storage in self.storages:
            s = storage.stats
            fetch["requests"] += s.requests
            fetch["bytes"] += s.bytes_read
            fetch["retries"] += s.retries
            fetch["throttles"] += s.throttles
            fetch["truncated"] += s.truncated
            fetch["inflight_bytes"] += storage.inflight_bytes
            latencies.extend(s._latencies_s)
        cache = self.range_cache
        fetch["cache_hits"] = cache.hits if cache is not None else 0
        fetch["cache_saved_bytes"] = cache.saved_bytes if cache is not None else 0
        latencies.sort()
        for q in (50, 99):
            fetch[f"p{q}_latency_s"] = (
                latencies[min(len(latencies) - 1, round(q / 100 * (len(latencies) - 1)))]
                if latencies else None
            )  # fmt: skip
        return {
            "elapsed_s": elapsed,
            "delivered": self.delivered,
            "consumer_stall_s": self.stall_s,
            "stages": {name: st.as_dict() for name, st in self.stages.items()},
            "fetch": fetch,
            "skipped": [
                {"dataset": d, "shard": u, "sample": s, "error": e}
                for d, u, s, e in self.ledger.skipped
            ],
        }


async def _flatten(source: Channel[list[Fetched]]) -> AsyncIterator[Fetched]:
    async for group in source:
        for fetched in group:
            yield fetched


async def _counted(source: Channel[Block], stats: StageStats) -> AsyncIterator[Block]:
    while True:
        try:
            block = await timed_receive(source, stats)
        except StopAsyncIteration:
            return
        stats.items_in += len(block.items)
        yield block


class _ProgressBar:
    def __init__(self, run: _Run) -> None:
        from tqdm import tqdm

        self.run = run
        self.bar = tqdm(unit=" items", dynamic_ncols=True, desc="zephon")
        self.last = time.perf_counter()

    def advance(self, n: int) -> None:
        self.bar.update(n)
        now = time.perf_counter()
        if now - self.last > 0.5:
            self.last = now
            elapsed = max(1e-9, now - self.run.started)
            mb = sum(s.stats.bytes_read for s in self.run.storages) / 1e6
            self.bar.set_postfix_str(f"{mb / elapsed:.1f} MB/s, {self.bar.n / elapsed:.0f} items/s")

    def close(self) -> None:
        self.bar.close()


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:
        return asyncio.new_event_loop()


class _Bridge:
    """Runs a pipeline on a background event loop and hands blocks to the calling thread."""

    def __init__(self, pipe: Pipeline, progress: bool) -> None:
        self.loop = _new_loop()
        self.thread = threading.Thread(
            target=self.loop.run_forever, name="zephon-loop", daemon=True
        )
        self.thread.start()
        self.pipe = pipe
        self.agen = pipe._blocks(progress)
        self.closed = False

    def __iter__(self) -> Iterator[Any]:
        while True:
            future = asyncio.run_coroutine_threadsafe(self._next(), self.loop)
            block = future.result()
            if block is None:
                return
            yield from self.pipe._received.open(block, self.pipe._out(block.items))

    async def _next(self) -> Block | None:
        try:
            return await self.agen.__anext__()
        except StopAsyncIteration:
            return None

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            asyncio.run_coroutine_threadsafe(self.agen.aclose(), self.loop).result()
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join()
            self.loop.close()

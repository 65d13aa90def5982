"""The builder: ``Pipeline``, a fluent and immutable description, and its iteration.

Every builder method returns a new pipeline with one more step (the spec is frozen);
iterating starts a :class:`~zephon.pipeline.run.Run` of the spec; checkpoints are what the
consumer received (:mod:`zephon.pipeline.state`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator
from functools import partial
from typing import Any

from zephon.choices import Engine, OnError
from zephon.engine.runner import Escaped
from zephon.errors import ConfigError
from zephon.ops.block import Block
from zephon.ops.operator import Operator
from zephon.pipeline import state
from zephon.pipeline.bridge import SyncBridge, aiterate, consuming
from zephon.pipeline.images import ImageSteps
from zephon.pipeline.notes import named
from zephon.pipeline.placement import placement
from zephon.pipeline.process import ProcessEngine
from zephon.pipeline.progress import ProgressBar
from zephon.pipeline.ranks import coordinates
from zephon.pipeline.run import Run
from zephon.pipeline.samples import SampleSteps
from zephon.pipeline.spec import PipelineSpec
from zephon.pipeline.text import TextSteps
from zephon.plan import StaticMixtureWorkSource
from zephon.storage import RetryPolicy, StorageLimits

__all__ = ["Pipeline"]


class Pipeline(SampleSteps, TextSteps, ImageSteps):
    """Fetches a work source's range requests and runs operators over the samples.

    Args:
        source: the curriculum (its datasets must be :class:`~zephon.dataset.Dataset`).
        rank: this process's data-parallel rank; found if not given (see
            :mod:`zephon.pipeline.ranks`: a device mesh, ``torch.distributed``, ``RANK``).
            Under tensor or pipeline parallelism the global rank is wrong: pass
            ``dp_rank`` and ``dp_size``, or ``device_mesh``.
        world_size: the number of data-parallel ranks; default from ``torch.distributed``
            or ``WORLD_SIZE``.
        dp_rank: the data-parallel rank (the names ``rank``/``world_size`` take too): the
            processes of one tensor- or pipeline-parallel group pass the same ``dp_rank`` and
            receive the same samples.
        dp_size: the number of data-parallel groups.
        device_mesh: a torch ``DeviceMesh``: the coordinates along its data-parallel
            dimensions (``dp``, ``data_parallel``, ``dp_replicate``/``dp_shard``).
        lanes: logical streams (default ``world_size``); must be a multiple of ``world_size``.
            Rank ``r`` owns lanes ``[r * lanes / world_size, (r + 1) * lanes / world_size)``.
        deterministic: ``False`` delivers in completion order instead of curriculum order.
        on_error: ``"raise"``, or ``"skip"`` bad samples (counted, listed in ``stats()``) up
            to ``max_skipped``: those that fail to decode, and those for which a step raises
            ``FormatError`` (a corrupt image, a missing named object).
        fetch_budget_bytes: fetched bytes held in the pipeline at most.
        max_inflight_requests: reads in flight per lane at most.
        limits: storage client bounds.
        retry: storage retry policy.
        decode_processes: decode in a worker pool of this size (``0``: in process).
        prefetch: blocks of output kept ready (a ``for`` loop's thread holds one more).
        range_cache_bytes: recently fetched ranges kept so that neighbouring chunks fetch
            shared bytes once (see :class:`~zephon.ops.fetch.RangeCache`); more where the
            data is read in units (four Parquet files' row groups, up to 512 MiB); ``0``
            disables.
        cache_dir: a local directory caching fetched byte ranges across epochs and runs,
            shared safely by every process of the node (opt-in; :class:`~zephon.storage.DiskCache`).
        cache_limit_bytes: the cache's size limit (least recently used ranges go first).
        provenance: add ``sample["_provenance"] = {"dataset", "shard", "sample"}`` (name,
            shard URI, index in the shard) to every dict sample (a list per batch).
        engine: ``"thread"`` runs the event loop on a thread of this process (``for``) or
            in the caller's loop (``async for``); ``"process"`` runs the pipeline in a child
            process, numeric arrays back through shared memory, so a training step holding
            the GIL never slows the loader (:mod:`zephon.pipeline.process`; functions must
            pickle).

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
        on_error: OnError = "raise",
        max_skipped: int = 1000,
        fetch_budget_bytes: int = 256 << 20,
        max_inflight_requests: int = 64,
        limits: StorageLimits | None = None,
        retry: RetryPolicy | None = None,
        decode_processes: int = 0,
        prefetch: int = 4,
        range_cache_bytes: int = 64 << 20,
        cache_dir: str | None = None,
        cache_limit_bytes: int = 64 << 30,
        provenance: bool = False,
        engine: Engine = "thread",
        dp_rank: int | None = None,
        dp_size: int | None = None,
        device_mesh: Any = None,
    ) -> None:
        rank, world_size = coordinates(rank, world_size, dp_rank, dp_size, device_mesh)
        spec = PipelineSpec(
            source,
            rank,
            world_size,
            world_size if lanes is None else lanes,
            deterministic=deterministic,
            on_error=on_error,
            max_skipped=max_skipped,
            fetch_budget_bytes=fetch_budget_bytes,
            max_inflight_requests=max_inflight_requests,
            limits=limits,
            retry=retry,
            decode_processes=decode_processes,
            prefetch_blocks=prefetch,
            range_cache_bytes=range_cache_bytes,
            cache_dir=None if cache_dir is None else str(cache_dir),
            cache_limit_bytes=cache_limit_bytes,
            provenance=provenance,
            engine=engine,
        )
        self._init(spec)

    def __getstate__(self) -> dict[str, Any]:
        """A copy for another process (a DataLoader worker): description, restored position."""
        return {"spec": self.spec, "resume": self._resume}

    def __setstate__(self, saved: dict[str, Any]) -> None:
        resume: state.Resume = saved["resume"]
        self._init(saved["spec"])
        self._resume, self._received = resume, resume.received()

    def _init(self, spec: PipelineSpec) -> None:
        self.spec = spec
        self._resume = state.Resume()
        self._received = state.Received()
        self._last: Run | None = None
        self._runs: weakref.WeakSet[Run] = weakref.WeakSet()
        self._child: ProcessEngine | None = None  # the current run, with engine="process"
        self._child_state: dict[str, Any] | None = None  # its last item's checkpoint

    # -- building ---------------------------------------------------------------------

    def _with(self, op: Operator | None = None, **changes: Any) -> Pipeline:
        if op is not None:
            changes["steps"] = (*self.spec.steps, op)
        new = object.__new__(Pipeline)
        new._init(dataclasses.replace(self.spec, **changes))
        return new

    def to_torch(self, pin_memory: bool = False) -> Pipeline:
        """Deliver numpy arrays as torch tensors (the ``torch`` extra); after ``batch`` too."""
        try:  # the adapter is imported here, on request: the pipeline never depends on torch
            from zephon.torch import to_tensors
        except ImportError:
            raise ConfigError("to_torch() needs torch: pip install 'zephon[torch]'") from None
        return self._with(convert=partial(to_tensors, pin_memory=pin_memory))

    def to_torch_dataset(self, pin_memory: bool = False) -> Any:
        """This pipeline as a torch ``IterableDataset`` with ``state_dict``/``load_state_dict``
        (for ``DataLoader(batch_size=None)`` and torchdata's ``StatefulDataLoader``)."""
        try:
            from zephon.torch import ZephonIterableDataset
        except ImportError:
            msg = "to_torch_dataset() needs torch: pip install 'zephon[torch]'"
            raise ConfigError(msg) from None
        return ZephonIterableDataset(self, pin_memory)

    def prefetch(self, blocks: int) -> Pipeline:
        """Keep up to ``blocks`` blocks of output ready ahead of the consumer."""
        return self._with(prefetch_blocks=blocks)

    def decode(self, processes: int = 0, executor: Any = None) -> Pipeline:
        """Decode in a pool of ``processes`` (``0``: in the loop), or on ``executor``."""
        inflight, remote = placement(processes, executor, None, "decoder")
        return self._with(decode_processes=inflight, decode_executor=remote)

    def for_rank(self, rank: int, world_size: int) -> Pipeline:
        """The same pipeline as rank ``rank`` of ``world_size`` (lanes unchanged)."""
        return self._with(rank=rank, world_size=world_size)

    @property
    def source(self) -> StaticMixtureWorkSource:
        """The work source (the curriculum)."""
        return self.spec.source

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self.spec.rank

    @property
    def world_size(self) -> int:
        """The number of ranks."""
        return self.spec.world_size

    @property
    def dp_rank(self) -> int:
        """This process's data-parallel rank (``rank``)."""
        return self.spec.rank

    @property
    def dp_size(self) -> int:
        """The number of data-parallel ranks (``world_size``)."""
        return self.spec.world_size

    @property
    def lanes(self) -> int:
        """Lanes of the whole run (every rank's)."""
        return self.spec.lanes

    @property
    def my_lanes(self) -> range:
        """The lanes this rank owns."""
        return self.spec.my_lanes

    def explain(self) -> str:
        """The planned stages and their concurrency, as text."""
        return self.spec.explain()

    def stats(self) -> dict[str, Any]:
        """Counters of the current (or last) run: per stage, fetch, consumer, skipped."""
        if self._child is not None:
            return self._child.stats()
        return self._last.stats() if self._last is not None else {}

    # -- checkpoints ------------------------------------------------------------------

    def checkpoint(self) -> dict[str, Any]:
        """JSON state of what the consumer has received, for this rank's lanes.

        Small (a cursor per lane) and free of pickles. It holds this rank's lanes only: to
        restore on another world size, join every rank's checkpoint with
        :meth:`merge_checkpoints` (a rank refuses a state that lacks one of its lanes). A
        custom ``apply`` op is resumed exactly if it is stateless (each output depends only
        on the latest input) or implements ``state() -> dict`` (JSON) and ``restore(dict)``.
        """
        if self._child_state is not None:  # what the child says this consumer has received
            return copy.deepcopy(self._child_state)
        return state.checkpoint(self.spec, self._received, self._resume)

    @staticmethod
    def merge_checkpoints(states: list[dict[str, Any]]) -> dict[str, Any]:
        """One checkpoint from the checkpoints of several ranks (their lanes together)."""
        return state.merge_checkpoints(states)

    def restore(self, checkpoint: dict[str, Any]) -> None:
        """Continue, on the next iteration, exactly after what ``checkpoint`` records as
        received.

        Reads only this rank's lanes. A merged checkpoint of another lane count is re-laned:
        the rest of the curriculum, and the items operators held, are dealt to this
        pipeline's lanes (exact as a multiset; the order after the cut changes). Raises
        ``StateMismatch`` naming what differs when the checkpoint belongs to another pipeline
        (datasets, seed, operators...) or lacks lanes it needs.
        """
        self._resume = state.restore(self.spec, checkpoint)
        self._received = self._resume.received()
        self._child_state = None

    # -- running ----------------------------------------------------------------------

    async def _blocks(self, progress: bool) -> AsyncGenerator[Block, None]:
        """Run the pipeline, yielding a block at a time."""
        # A restored start carries on the checkpoint's counts; any other starts afresh.
        received = self._resume.received() if self._resume.lanes else state.Received()
        self._received = received
        run = Run(self.spec, self._resume, received)
        self._last = run
        self._runs.add(run)
        bar = None
        if progress:
            unit = "batches" if any(op.batches for op in self.spec.steps) else "samples"
            bar = ProgressBar(time.perf_counter(), run.data_bytes, unit=unit)
        await run.start()
        try:
            while True:
                started = time.perf_counter()
                try:
                    block = await run.output.receive()
                except StopAsyncIteration:  # every lane is over (see _all_received)
                    break
                except Exception as exc:
                    named(exc, self.spec.source.datasets)
                    raise
                run.stall_s += time.perf_counter() - started
                run.delivered += len(block.items)
                if bar is not None:
                    bar.advance(len(block.items))
                yield block
        finally:
            if bar is not None:
                bar.close()
            await run.stop()

    def _all_received(self) -> None:
        """Every lane's items received: a checkpoint now says each lane is over. Set by the
        consumer, not when the run ends: the bridge reads a block ahead of the consumer."""
        self._received.ended = frozenset(self.spec.my_lanes)

    def _open(self, block: Block) -> Iterator[Any]:
        """The block's items for the consumer, counted as received as they are taken."""
        convert = self.spec.convert
        items = block.items if convert is None else [convert(x) for x in block.items]
        return self._received.open(block, items)

    async def aiter(self, progress: bool = False) -> AsyncIterator[Any]:
        """Async iteration, optionally with a progress bar."""
        if self.spec.engine == "process":
            async for item, checkpoint in aiterate(self._in_child(progress), self.close):
                self._child_state = checkpoint  # once delivered (a cancelled wait drops it)
                yield item
            return
        try:
            async with contextlib.aclosing(self._blocks(progress)) as blocks:
                with consuming():
                    async for block in blocks:
                        for item in self._open(block):
                            yield item  # the checkpoint is what the consumer has received
            self._all_received()
        except Escaped as exc:  # a user function's KeyboardInterrupt or SystemExit
            raise exc.original from None
        finally:
            self._received.release()

    __aiter__ = aiter

    def __iter__(self) -> Iterator[Any]:
        return self.iter()

    def iter(self, progress: bool = False) -> Iterator[Any]:
        """Iterate from synchronous code: the pipeline runs on a background event loop (uvloop
        when installed); blocks cross threads, items are yielded here. Breaking out or closing
        the iterator stops the pipeline and releases every task, connection and worker.
        With ``engine="process"`` the pipeline runs in a child process instead
        (:mod:`zephon.pipeline.process`)."""
        if self.spec.engine == "process":
            for item, checkpoint in self._in_child(progress):
                self._child_state = checkpoint
                yield item
            return
        bridge = SyncBridge(self._blocks(progress))
        try:
            with consuming():
                for block in bridge:
                    yield from self._open(block)
            self._all_received()
        except Escaped as exc:  # a user function's KeyboardInterrupt or SystemExit
            raise exc.original from None
        finally:
            bridge.close()
            self._received.release()

    def _in_child(self, progress: bool) -> Generator[Any, None, None]:
        if not self._resume.lanes:
            self._received = state.Received()  # a fresh start, as in-thread
        self._child_state = None
        child = self._child = ProcessEngine(self, progress)
        try:
            yield from child
            self._child_state = child.final_state or self._child_state
        finally:
            child.close()

    async def aclose(self) -> None:
        """Stop every running iteration of this pipeline."""
        for run in list(self._runs):
            await run.stop()
        if self._child is not None:  # its close waits for the child process to end
            await asyncio.to_thread(self._child.close)

    def close(self) -> None:
        """Stop every running iteration started from synchronous code, and the current
        child process (its iteration on another thread ends, as an in-thread run's)."""
        for run in list(self._runs):
            run.stop_threadsafe()
        if self._child is not None:
            self._child.close()

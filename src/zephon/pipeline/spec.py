"""The description of a pipeline: frozen, validated at construction, nothing running.

A :class:`PipelineSpec` is what the builder (:class:`~zephon.pipeline.Pipeline`) grows one
step at a time and what the running graph is built from; two pipelines with equal specs
produce the same stream.
"""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephon.choices import Engine, OnError
from zephon.errors import ConfigError
from zephon.formats.index import RowGroupIndex, StreamIndex, WholeIndex
from zephon.ops.itemops import ItemOperator
from zephon.ops.operator import Operator, placement_label
from zephon.plan import StaticMixtureWorkSource
from zephon.plan.report import read_amplification
from zephon.storage import RetryPolicy, StorageLimits

BLOCK_BYTES = 16 << 20  # the largest block of decoded records (see PipelineSpec.block_bytes)
RANGE_CACHE_FLOOR = 8 << 20  # the range cache's least size (PipelineSpec.range_cache_floor)

__all__ = ["PipelineSpec", "fusable"]


def fusable(before: Operator, after: Operator) -> bool:
    """Whether ``after`` runs in the same call as ``before``: both maps or filters on the
    same workers (the pool, or the same Ray executor), or both synchronous and in this
    process (on the run's helper thread). Fused, a decode then a crop decodes only the crop,
    and a block's full-size images are never all held at once (images in the main process,
    benchmarks/images.py: 1.23-1.41x -> 1.62-1.95x the best peer, 661-1,124 -> 405-867 MB)."""
    if not (isinstance(before, ItemOperator) and isinstance(after, ItemOperator)):
        return False
    ops = (before, after)
    if not (before.fusable and after.fusable):
        return False
    if before.processes > 0 and after.processes > 0:
        return bool(before.executor == after.executor)
    in_process = all(op.processes == 0 and op.executor is None for op in ops)
    return in_process and not any(inspect.iscoroutinefunction(op.fn) for op in ops)


@dataclass(frozen=True)
class PipelineSpec:
    """Everything a run is built from (see :class:`~zephon.pipeline.Pipeline` for the
    arguments). ``convert`` turns the consumer's items into another type (torch tensors);
    it is not part of the stream's identity."""

    source: StaticMixtureWorkSource
    rank: int
    world_size: int
    lanes: int
    deterministic: bool = True
    on_error: OnError = "raise"
    max_skipped: int = 1000
    fetch_budget_bytes: int = 256 << 20
    max_inflight_requests: int = 64
    limits: StorageLimits | None = None
    retry: RetryPolicy | None = None
    decode_processes: int = 0
    decode_executor: Any = None
    prefetch_blocks: int = 4
    range_cache_bytes: int = 64 << 20
    cache_dir: str | None = None
    cache_limit_bytes: int = 64 << 30
    provenance: bool = False
    steps: tuple[Operator, ...] = ()
    convert: Callable[[Any], Any] | None = None
    engine: Engine = "thread"

    def __post_init__(self) -> None:
        if self.engine not in ("thread", "process"):
            raise ConfigError(f"engine must be 'thread' or 'process', got {self.engine!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"need 0 <= rank < world_size, got rank={self.rank}, world_size={self.world_size}"
            )
        if self.lanes < 1 or self.lanes % self.world_size:
            raise ConfigError(
                f"lanes ({self.lanes}) must be a positive multiple of world_size "
                f"({self.world_size})"
            )
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if not isinstance(self.max_skipped, int) or self.max_skipped < 0:
            raise ConfigError(f"max_skipped must be an int >= 0, got {self.max_skipped!r}")
        for name in (
            "fetch_budget_bytes",
            "max_inflight_requests",
            "prefetch_blocks",
            "cache_limit_bytes",
        ):
            if getattr(self, name) < 1:
                label = "prefetch" if name == "prefetch_blocks" else name
                raise ConfigError(f"{label} must be >= 1, got {getattr(self, name)}")
        if self.decode_processes < 0:
            raise ConfigError(f"decode_processes must be >= 0, got {self.decode_processes}")
        datasets = getattr(self.source, "datasets", None)
        if not datasets or any(not hasattr(d, "codec") for d in datasets):
            raise ConfigError("the work source's datasets must be discovered Dataset objects")
        if self.limits is None:
            object.__setattr__(
                self, "limits", StorageLimits(max_inflight_bytes=self.fetch_budget_bytes)
            )

    @property
    def block_bytes(self) -> int:
        """About the most decoded bytes one block carries, and the byte bound of each channel
        between stages (so large records never pile up downstream of the fetch budget)."""
        return min(BLOCK_BYTES, max(1 << 20, self.fetch_budget_bytes // 4))

    @functools.cached_property  # once per pipeline: it walks every shard's layout
    def range_cache_capacity(self) -> int:
        """``range_cache_bytes``, or more where the data is read in units (Parquet row groups,
        compressed shards read whole): four of the largest such shards, up to 512 MiB. Every
        chunk that draws from a unit reads all of it, and a block shuffle interleaves the
        units of about four shards, so a cache that cannot hold them reads them again: a
        block-shuffled Parquet image dataset (68 MB files of 17 MB row groups) fetched 1.66x
        its bytes with 64 MiB, 1.40x with 136 MiB, 1.03x with 256 MiB (and 0.80 -> 0.90x the
        bare decode loop's images/s). ``0`` stays off."""
        if not self.range_cache_bytes:
            return 0
        return max(self.range_cache_bytes, min(4 * self._largest_unit, 512 << 20))

    @property
    def range_cache_floor(self) -> int:
        """What the range cache holds until a read shows it needs more (see
        :class:`~zephon.ops.fetch.RangeCache`): four of the largest units, at least 8 MiB. A
        global shuffle's reads go through gaps that later chunks draw from only if the cache
        holds them (the planner counts on its capacity): it starts full size."""
        if getattr(self.source, "shuffle", None) == "global":
            return self.range_cache_capacity
        return min(self.range_cache_capacity, max(RANGE_CACHE_FLOOR, 4 * self._largest_unit))

    @functools.cached_property
    def _largest_unit(self) -> int:
        return largest_unit_shard(self.source.manifests)

    @property
    def read_window_bytes(self) -> int:
        """How much of a chunk of large records a lane reads (and puts back in order) at a
        time: half its share of the fetch budget, within one to sixteen of the largest reads.
        A block-shuffled chunk interleaves many runs, so a window of one read's bytes cuts
        each run into reads of a few records (images: ~7 per read), and every request costs:
        tens of milliseconds, a charge, and on some servers a pass over the whole object
        (moto copies it: 4,000 images in 34 MB tars, 6.1 CPU-seconds of the server's with
        windows of four reads, 1.4 with sixteen, and 369 -> 505-587 images/s)."""
        largest = self.source.max_request_bytes
        share = self.fetch_budget_bytes // max(1, len(self.my_lanes)) // 2
        return max(largest, min(16 * largest, share))

    @property
    def storage_limits(self) -> StorageLimits:
        assert self.limits is not None  # set in __post_init__
        return self.limits

    @property
    def my_lanes(self) -> range:
        """The lanes this rank owns: a contiguous share of ``lanes``."""
        per = self.lanes // self.world_size
        return range(self.rank * per, (self.rank + 1) * per)

    @property
    def stateful_steps(self) -> int:
        return sum(op.stateful for op in self.steps)

    @property
    def stateful_prefix(self) -> int:
        """Steps up to and including the last stateful one (those a handover replays)."""
        return max((i + 1 for i, op in enumerate(self.steps) if op.stateful), default=0)

    def pool_size(self) -> int:
        """Worker processes the run needs: the most any step placed on the pool asks for."""
        local = [step.processes for step in self.steps if step.executor is None]
        return max([self.decode_processes if self.decode_executor is None else 0, *local])

    def step_modules(self) -> list[str]:
        """The modules of the functions run in worker processes (what a worker imports
        before its first block), the decoders' included."""
        fns = [d.codec for d in self.source.datasets] if self.decode_processes else []
        fns += [
            op.fn
            for op in self.steps
            if isinstance(op, ItemOperator) and op.processes and op.executor is None
        ]
        names = [getattr(fn, "__module__", None) or type(fn).__module__ for fn in fns]
        names = [n for n in names if n and n != "__main__"]
        # and what those modules import lazily, for their workers (e.g. the JPEG decoder)
        extra = [m for n in names for m in getattr(sys.modules.get(n), "WORKER_IMPORTS", ())]
        return list(dict.fromkeys([*names, *extra]))

    def remote_executors(self) -> list[Any]:
        """The distinct Ray executors of the decode and the steps."""
        found = [self.decode_executor, *(step.executor for step in self.steps)]
        return list(dict.fromkeys(e for e in found if e is not None))

    def identity(self) -> dict[str, Any]:
        """What a checkpoint must match to restore into this pipeline."""
        return {
            "source": self.source.describe(),
            "locations": [d.location() for d in self.source.datasets],
            "lanes": self.lanes,
            "ops": [step.identity() for step in self.steps],
            "settings": [step.settings() or None for step in self.steps],
            "on_error": self.on_error,
        }

    def explain(self) -> str:
        """The planned stages and their concurrency, as text."""
        ws = self.source
        names = ", ".join(f"{d.name} ({d.format}, {d.num_samples} samples)" for d in ws.datasets)
        decode = placement_label(self.decode_processes, self.decode_executor)
        if self.on_error == "skip":
            decode += ", skip bad samples"
        lines = [
            f"source: StaticMixtureWorkSource[{names}] shuffle={ws.shuffle} "
            f"chunk_size={ws.chunk_size} passes={ws.stop_after_passes} "
            f"policy={ws.exhausted_policy}",
            f"rank {self.rank}/{self.world_size}: lanes {list(self.my_lanes)} of {self.lanes}, "
            "each:",
            f"  plan -> fetch (<= {self.max_inflight_requests} reads in flight, shared budget "
            f"{self.fetch_budget_bytes / 2**20:.0f} MiB, storage <= "
            f"{self.storage_limits.max_requests} requests)",
            f"  -> decode ({decode})",
        ]
        for i, step in enumerate(self.steps):
            same = i and fusable(self.steps[i - 1], step)
            lines.append(f"  -> {step.label()}" + (_same_call(step) if same else ""))
        for d in ws.datasets:
            whole = sum(1 for index in d.indexes if isinstance(index, StreamIndex | WholeIndex))
            if whole:
                lines.append(
                    f"note: {d.name}: {whole} of {len(d.indexes)} shards are compressed as a "
                    "whole; each is one read of the whole shard, decompressed once per process"
                )
        order = "round-robin" if self.deterministic else "completion order"
        lines.append(
            f"merge lanes ({order}) -> prefetch({self.prefetch_blocks} blocks) -> consumer"
        )
        lines += read_lines(ws, self.lanes, self.range_cache_capacity)
        return "\n".join(lines)


def _same_call(step: Operator) -> str:
    return " (in the same worker call)" if step.processes else " (in the same call)"


AMPLIFICATION_WARNING = 1.5  # reads past this many times the samples' bytes are pointed out


def largest_unit_shard(manifests: Any) -> int:
    """Bytes of the largest shard read in units: a Parquet file's selected column chunks, or
    a shard read whole (compressed streams); 0 where every shard is read by records."""
    best = 0
    for manifest in manifests:
        if manifest.all_records:
            continue
        seen: set[int] = set()
        for layout in manifest.layouts:
            if id(layout) in seen:  # a layout repeated for every shard
                continue
            seen.add(id(layout))
            if isinstance(layout, RowGroupIndex) and len(layout.chunks):
                best = max(best, int((layout.chunks[..., 1] - layout.chunks[..., 0]).sum()))
            elif isinstance(layout, StreamIndex | WholeIndex):
                best = max(best, sum(b - a for a, b in layout.span(0, 0)))
    return best


def read_lines(ws: Any, lanes: int, cache_bytes: int = 0) -> list[str]:
    """What ``explain()`` says of the plan's reads: their bytes over the samples' (estimated
    on the first chunks of every lane, through a range cache of ``cache_bytes``), and a warning
    above 1.5x."""
    amplification = read_amplification(ws, lanes, cache_bytes=cache_bytes)
    if amplification is None:
        return []
    lines = [f"reads: about {amplification:.2f}x the samples' bytes (first chunks of each lane)"]
    if amplification > AMPLIFICATION_WARNING:
        lines.append(
            f"warning: the plan reads {amplification:.1f}x the data it uses: samples a few "
            "records apart (a selection's holes, say) are read with the bytes between them; a "
            "smaller coalesce_gap_bytes reads the samples alone, in more requests"
        )
    return lines

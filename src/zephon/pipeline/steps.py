"""The stages of a lane after its chunks are assembled: one per step of the chain.

Adjacent ``map``/``filter`` steps placed on the same workers run as one stage (a
:class:`~zephon.ops.transform.Chain`): a block crosses to a worker and back once for all of
them. The chain, and so every checkpoint, is unchanged: fusing only decides where work runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any

import numpy as np

from zephon.engine.channel import Channel
from zephon.engine.runner import forward, ordered, start_stage
from zephon.engine.stats import StageStats
from zephon.errors import FormatError
from zephon.ops.block import Block
from zephon.ops.itemops import ItemOperator, Map
from zephon.ops.marks import Mark, for_op
from zephon.ops.operator import LaneContext, Operator, StreamOperator
from zephon.ops.transform import Chain
from zephon.ops.windows import REPLAYED
from zephon.pipeline.resources import Resources, counted
from zephon.pipeline.spec import PipelineSpec, fusable
from zephon.storage.gate import CapacityGate

__all__ = ["PIECE_BYTES", "fused", "grower", "grows_on_output", "growth_step", "start_steps"]

PIECE_BYTES = 4 << 20  # fetched bytes per piece of a block sent to a worker
FIRST_PIECE = 64  # items in the first piece of a lane for an in-process step


def fused(steps: tuple[Operator, ...], indices: range) -> list[tuple[str, Operator, range]]:
    """The stages that run ``steps[indices]``: each with its name (``map#3``, or ``map#3+4``
    for two steps fused), its operator and the indices of the steps it runs."""
    out: list[tuple[str, Operator, range]] = []
    group: list[int] = []

    def close() -> None:
        if len(group) == 1:
            one = group[0]
            out.append((f"{steps[one].name}#{one}", steps[one], range(one, one + 1)))
        elif group:
            ops = [steps[i] for i in group]
            chain = Chain([(op.name, op.fn) for op in ops if isinstance(op, ItemOperator)])
            processes = max(op.processes for op in ops)
            name = "map#" + "+".join(map(str, group))
            op = Map(chain, processes, ops[0].executor)
            out.append((name, op, range(group[0], group[-1] + 1)))
        group.clear()

    for i in indices:
        if group and not fusable(steps[group[-1]], steps[i]):
            close()
        group.append(i)
    close()
    return out


def start_steps(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    tag: str,
    current: Channel[Block],
    indices: range,
    lane: int,
    resume_mark: Mark | None,
    budget: CapacityGate,
) -> Channel[Block]:
    """Start the steps ``indices`` of the chain on ``current``; returns their output.

    The lane's fetch ``budget`` (its slow start) grows by what its first step takes from
    assembly if that step runs in this process, and by the output of :func:`growth_step`
    if it runs on workers."""
    depth = sum(op.stateful for op in spec.steps[: indices.start])
    replay = _replay_plan(spec, indices, resume_mark, lane)
    grow_at = growth_step(spec)
    on_skip = res.skipped if spec.on_error == "skip" else None
    for label, op, runs in fused(spec.steps, indices):
        if replay is not None and op is spec.steps[replay[0]]:
            current = _mark_replayed(tg, spec, res, tag, current, replay[1])
        source = current
        out = res.lane_channel(spec, grower(budget) if grow_at in runs else None)
        name = f"{label}[{tag}]"
        stats = res.stats(name, str(op.processes or 1))
        if isinstance(op, ItemOperator) and op.processes:
            body = _pooled(tg, spec, res, op, source, out, stats, name)
        elif isinstance(op, ItemOperator):
            body = _in_process(spec, res, op, source, out, stats, name, runs.stop)
        else:
            assert isinstance(op, StreamOperator), f"{op!r} is not an operator"
            resume = for_op(resume_mark, depth) if op.stateful and resume_mark else None
            ctx = LaneContext(lane, depth, resume, stats, res.storages, res.datasets, on_skip)
            body = _streamed(op, ctx, source, out, spec.block_bytes)
        depth += op.stateful
        start_stage(tg, name, stats, body)
        current = out
    return current


def grows_on_output(spec: PipelineSpec) -> bool:
    """Whether the slow start grows by what the lane delivers (its first step runs on
    workers) rather than by what that step takes from assembly (see :func:`start_steps`)."""
    return bool(spec.steps) and bool(spec.steps[0].processes or spec.steps[0].executor)


def growth_step(spec: PipelineSpec) -> int | None:
    """The step by whose output a lane's slow start grows when its first step runs on
    workers: the lane's last (what it delivers), or the last before a step that holds
    items back until it has many (a shuffle without warm-up, pack, custom steps), so the
    read-ahead never waits for a window to fill. A pooled step takes blocks to queue them:
    growing by what it took, or even by what it had done, let a lane fetch its next chunks
    while the workers still decoded the first batch's images, on the same CPU (images at
    +30 ms: first batch 1.5-2.0 s -> 1.4 s -> 0.8-1.0 s growing by delivery)."""
    if not grows_on_output(spec):
        return None
    last = 0
    for i, op in enumerate(spec.steps[1:], 1):
        if op.holds_items():
            break
        last = i
    return last


def grower(budget: CapacityGate) -> Callable[[Block], None]:
    """A channel's ``on_take`` that grows ``budget`` by each block's fetched bytes."""
    return lambda block: budget.grow(block.nbytes)


def _replay_plan(
    spec: PipelineSpec, indices: range, mark: Mark | None, lane: int
) -> tuple[int, np.ndarray] | None:
    """After a restore, where the lane marks the items its shuffle will skip, and which: when
    the first stateful step is a shuffle (so the lane replays from its window's start) and
    tokenize steps come just before it (one item out per item in, never dropped, so
    positions there are the shuffle's), the first of those steps and the positions."""
    stateful = [i for i in indices if spec.steps[i].stateful]
    if mark is None or indices.start != 0 or not stateful:
        return None
    at = stateful[0]
    first = at
    while first > 0 and getattr(spec.steps[first - 1], "one_to_one", False):
        first -= 1
    if first == at:
        return None
    skips = spec.steps[at].replay_skips(lane, for_op(mark, 0))
    return (first, skips) if skips is not None else None


def _mark_replayed(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    tag: str,
    source: Channel[Block],
    skips: np.ndarray,
) -> Channel[Block]:
    """The lane's items with those at positions ``skips`` (counted from the restored window's
    start) replaced by :data:`REPLAYED`."""
    out = res.lane_channel(spec)
    name = f"replay[{tag}]"
    stats = res.stats(name)
    positions = skips.tolist()

    async def marked() -> AsyncIterator[Block]:
        at = i = 0
        async for block in counted(source, stats):
            n = len(block.items)
            if i < len(positions) and positions[i] < at + n:
                items = list(block.items)
                while i < len(positions) and positions[i] < at + n:
                    items[positions[i] - at] = REPLAYED
                    i += 1
                block = block.with_items(items)
            at += n
            yield block

    start_stage(tg, name, stats, forward(marked(), out, stats))
    return out


async def _pooled(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    op: ItemOperator,
    source: Channel[Block],
    out: Channel[Block],
    stats: StageStats,
    name: str,
) -> None:
    """An item operator in the worker pool or on Ray actors. Blocks are cut into
    pieces of about ``PIECE_BYTES`` of fetched data (at least two per worker), and two
    pieces per worker are in flight: every worker shares a large block (a few hundred images
    at milliseconds each), and each piece moves on as soon as it is done."""
    pool = res.pool_for(op.executor)
    workers = op.processes if op.executor is not None else getattr(pool, "processes", 1)

    async def pieces() -> AsyncIterator[Block]:
        async for block in source:
            count = max(2 * workers, -(-block.nbytes // PIECE_BYTES))
            for piece in block.split(count):
                yield piece

    async def one(block: Block) -> Block:
        return await _apply(spec, res, op, block, name, pool)

    await ordered(
        tg,
        pieces(),
        one,
        out,
        max(op.processes, 2 * workers),
        stats,
        deterministic=spec.deterministic,
        size=len,
    )


async def _in_process(
    spec: PipelineSpec,
    res: Resources,
    op: ItemOperator,
    source: Channel[Block],
    out: Channel[Block],
    stats: StageStats,
    name: str,
    after: int,
) -> None:
    """An item operator a block at a time on the run's helper thread (async ones in
    the loop), so fetching and delivery go on meanwhile. A lane's first items go in pieces
    of growing size: its first batch does not wait for a whole first chunk. The thread
    takes the block that starts earliest in its lane first (then the one of the later step,
    ``after`` steps into the chain): the lane the consumer will wait for next."""
    thread = res.encoder_thread()

    async def results() -> AsyncIterator[Block]:
        position = 0
        async for block in first_pieces(counted(source, stats), FIRST_PIECE):
            executor = thread.at((position, -after))
            position += len(block.items)
            yield await _apply(spec, res, op, block, name, None, executor)

    await forward(results(), out, stats)


async def _apply(
    spec: PipelineSpec,
    res: Resources,
    op: ItemOperator,
    block: Block,
    name: str,
    pool: Any,
    executor: Executor | None = None,
) -> Block:
    """``block`` through ``op`` (in ``pool``, else on ``executor`` or in the loop); bad input
    it reports names its sample, and under ``on_error="skip"`` is skipped and counted."""
    on_skip = res.skipped if spec.on_error == "skip" else None
    try:
        return await op.apply(block, pool, name, executor, on_skip)
    except FormatError as exc:
        res.name_sample(exc)
        raise


async def first_pieces(blocks: AsyncIterator[Block], first: int) -> AsyncIterator[Block]:
    """``blocks`` with a lane's first items cut where a shuffle's warm-up parts of ``first``
    end (after ``first`` items, then after twice as many as before each time: 64, 128, 256,
    ...; a slow start, as for reads), however the blocks come. So each part waits for its
    own items only, even when the lane's first block is short (a run ending at a shard's
    end): cutting pieces of those sizes from wherever blocks started left such a lane one
    block behind the others in every part, and the consumer waited for it."""
    cut, done = first, 0
    async for block in blocks:
        while done < cut < done + len(block.items):
            head, block = block.cut(cut - done)
            yield head
            done, cut = cut, 2 * cut
        done += len(block.items)
        if done == cut:
            cut *= 2
        yield block


async def _streamed(
    op: StreamOperator,
    lane: LaneContext,
    source: Channel[Block],
    out: Channel[Block],
    max_bytes: int,
) -> None:
    """A stream operator over the lane. What it emits leaves in blocks of about
    ``max_bytes`` at most: a shuffle's window is one block, and whole windows of large
    records in every channel after it held several times the window (256 KiB records,
    shuffle(32), an 8 MiB budget: 184 MB of growth)."""

    async def pieces() -> AsyncIterator[Block]:
        async for block in op.run(counted(source, lane.stats), lane):
            for piece in block.split(-(-block.nbytes // max_bytes)):
                yield piece

    await forward(pieces(), out, lane.stats)

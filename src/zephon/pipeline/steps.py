"""The stages of a lane after its chunks are assembled: one per step of the chain.

Adjacent ``map``/``filter`` steps placed on the same workers run as one stage (a
:class:`~zephon.ops.transform.Chain`): a block crosses to a worker and back once for all of
them. The chain, and so every checkpoint, is unchanged: fusing only decides where work runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from zephon.engine.channel import Channel, closing
from zephon.engine.runner import ordered, start_stage, timed_send
from zephon.engine.stats import StageStats
from zephon.errors import FormatError
from zephon.ops.batch import batch_blocks
from zephon.ops.block import Block
from zephon.ops.group import per_dataset_batches
from zephon.ops.marks import Mark, for_op
from zephon.ops.mixture import ensure_mixture
from zephon.ops.objects import fetch_block
from zephon.ops.pack import pack_blocks
from zephon.ops.shuffle import REPLAYED, replay_skips, shuffle_blocks
from zephon.ops.transform import Chain, apply_block, run_apply
from zephon.pipeline.resources import Resources, counted
from zephon.pipeline.spec import STATEFUL, PipelineSpec, Step, fusable
from zephon.storage.gate import CapacityGate

__all__ = ["PIECE_BYTES", "fused", "grower", "grows_on_output", "growth_step", "start_steps"]

PIECE_BYTES = 4 << 20  # fetched bytes per piece of a block sent to a worker
FIRST_PIECE = 64  # items in the first piece of a lane for an in-process step


def fused(steps: tuple[Step, ...], indices: range) -> list[tuple[str, Step, range]]:
    """The stages that run ``steps[indices]``: each with its name (``map#3``, or ``map#3+4``
    for two steps fused), its step and the indices of the steps it runs."""
    out: list[tuple[str, Step, range]] = []
    group: list[int] = []

    def close() -> None:
        if len(group) == 1:
            one = group[0]
            out.append((f"{steps[one].kind}#{one}", steps[one], range(one, one + 1)))
        elif group:
            chain = Chain([(steps[i].kind, steps[i].fn) for i in group])
            first = steps[group[0]]
            processes = max(steps[i].processes for i in group)
            name = "map#" + "+".join(map(str, group))
            out.append((name, Step("map", chain, processes, executor=first.executor),
                        range(group[0], group[-1] + 1)))  # fmt: skip
        group.clear()

    for i in indices:
        if group and not fusable(steps[group[-1]], steps[i]):
            close()
        group.append(i)
    close()
    return out


def start_steps(
    tg: asyncio.TaskGroup, spec: PipelineSpec, res: Resources, tag: str,
    current: Channel[Block], indices: range, lane: int, resume_mark: Mark | None,
    budget: CapacityGate,
) -> Channel[Block]:  # fmt: skip
    """Start the steps ``indices`` of the chain on ``current``; returns their output.

    The lane's fetch ``budget`` (its slow start) grows by what its first step takes from
    assembly if that step runs in this process, and by the output of :func:`growth_step`
    if it runs on workers."""
    depth = sum(step.kind in STATEFUL for step in spec.steps[: indices.start])
    replay = _replay_plan(spec, indices, resume_mark, lane)
    grow_at = growth_step(spec)
    for label, step, runs in fused(spec.steps, indices):
        if replay is not None and step is spec.steps[replay[0]]:
            current = _mark_replayed(tg, spec, res, tag, current, replay[1])
        source = current
        out = res.lane_channel(spec, grower(budget) if grow_at in runs else None)
        name = f"{label}[{tag}]"
        stats = res.stats(name, str(step.processes or 1))
        if step.kind in STATEFUL:
            at = _step_resume(resume_mark, depth)
            body = _stateful(step, lane, source, out, stats, depth, at, spec.block_bytes)
            depth += 1
        elif step.processes:
            body = _pooled(tg, spec, res, step, source, out, stats, name)
        elif step.kind == "batch":
            body = _batch(step, lane, source, out, stats)
        elif step.kind == "fetch_field":
            body = _fetch_field(tg, spec, res, step, source, out, stats)
        else:
            body = _in_process(spec, res, step, source, out, stats, name, runs.stop)
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
    for i, step in enumerate(spec.steps[1:], 1):
        if step.kind in STATEFUL and not (step.kind == "shuffle" and step.fn[1] > 0):
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
    stateful = [i for i in indices if spec.steps[i].kind in STATEFUL]
    if mark is None or indices.start != 0 or not stateful:
        return None
    at = stateful[0]
    shuffle = spec.steps[at]
    first = at
    while first > 0 and spec.steps[first - 1].kind == "tokenize":
        first -= 1
    if shuffle.kind != "shuffle" or first == at:
        return None
    seed, warmup = shuffle.fn
    resume = _step_resume(mark, 0)
    assert resume is not None
    skips = replay_skips(shuffle.size, seed, warmup, lane, resume)
    return (first, skips) if len(skips) else None


def _mark_replayed(
    tg: asyncio.TaskGroup, spec: PipelineSpec, res: Resources, tag: str,
    source: Channel[Block], skips: np.ndarray,
) -> Channel[Block]:  # fmt: skip
    """The lane's items with those at positions ``skips`` (counted from the restored window's
    start) replaced by :data:`REPLAYED`."""
    out = res.lane_channel(spec)
    name = f"replay[{tag}]"
    stats = res.stats(name)
    positions = skips.tolist()

    async def body() -> None:
        at = i = 0
        with closing(out):
            async for block in counted(source, stats):
                n = len(block.items)
                if i < len(positions) and positions[i] < at + n:
                    items = list(block.items)
                    while i < len(positions) and positions[i] < at + n:
                        items[positions[i] - at] = REPLAYED
                        i += 1
                    block = block.with_items(items)
                at += n
                stats.items_out += n
                await timed_send(out, block, stats)

    start_stage(tg, name, stats, body())
    return out


def _step_resume(mark: Mark | None, depth: int) -> tuple[Mark, Any] | None:
    """A stateful step's resume point: the mark as the steps before it saw it, and its own
    state."""
    return None if mark is None else for_op(mark, depth)


async def _pooled(
    tg: asyncio.TaskGroup, spec: PipelineSpec, res: Resources, step: Step,
    source: Channel[Block], out: Channel[Block], stats: StageStats, name: str,
) -> None:  # fmt: skip
    """map / filter / tokenize in the worker pool or on Ray actors. Blocks are cut into
    pieces of about ``PIECE_BYTES`` of fetched data (at least two per worker), and two
    pieces per worker are in flight: every worker shares a large block (a few hundred images
    at milliseconds each), and each piece moves on as soon as it is done."""
    pool = res.pool_for(step.executor)
    on_skip = res.skipped if spec.on_error == "skip" else None
    workers = step.processes if step.executor is not None else getattr(pool, "processes", 1)

    async def pieces() -> AsyncIterator[Block]:
        async for block in source:
            count = max(2 * workers, -(-block.nbytes // PIECE_BYTES))
            for piece in block.split(count):
                yield piece

    async def one(block: Block) -> Block:
        try:
            return await apply_block(step.kind, step.fn, block, pool, name, on_skip=on_skip)
        except FormatError as exc:
            res.name_sample(exc)
            raise

    await ordered(tg, pieces(), one, out, max(step.processes, 2 * workers), stats,
                  deterministic=spec.deterministic, size=len)  # fmt: skip


async def _fetch_field(
    tg: asyncio.TaskGroup, spec: PipelineSpec, res: Resources, step: Step,
    source: Channel[Block], out: Channel[Block], stats: StageStats,
) -> None:  # fmt: skip
    """The objects samples name, read in the loop: two blocks in flight, ``step.size``
    reads each."""
    on_skip = res.skipped if spec.on_error == "skip" else None

    async def one(block: Block) -> Block:
        return await fetch_block(step.fn, block, res.storages, res.datasets, step.size, on_skip)

    await ordered(tg, source, one, out, 2, stats, deterministic=spec.deterministic, size=len)


async def _in_process(
    spec: PipelineSpec, res: Resources, step: Step, source: Channel[Block],
    out: Channel[Block], stats: StageStats, name: str, after: int,
) -> None:  # fmt: skip
    """map / filter / tokenize a block at a time on the run's helper thread (async ones in
    the loop), so fetching and delivery go on meanwhile. A lane's first items go in pieces
    of growing size: its first batch does not wait for a whole first chunk. The thread
    takes the block that starts earliest in its lane first (then the one of the later step,
    ``after`` steps into the chain): the lane the consumer will wait for next."""
    thread = res.encoder_thread()
    on_skip = res.skipped if spec.on_error == "skip" else None
    position = 0
    with closing(out):
        async for block in first_pieces(counted(source, stats), FIRST_PIECE):
            executor = thread.at((position, -after))
            position += len(block.items)
            try:
                result = await apply_block(step.kind, step.fn, block, None, name, executor,
                                           on_skip)  # fmt: skip
            except FormatError as exc:
                res.name_sample(exc)
                raise
            stats.items_out += len(result.items)
            await timed_send(out, result, stats)


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


async def _batch(
    step: Step, lane: int, source: Channel[Block], out: Channel[Block], stats: StageStats
) -> None:
    with closing(out):
        async for block in batch_blocks(counted(source, stats), step.size, step.drop_last, lane):
            stats.items_out += len(block.items)
            await timed_send(out, block, stats)


async def _stateful(
    step: Step, lane: int, source: Channel[Block], out: Channel[Block], stats: StageStats,
    depth: int, resume: tuple[Mark, Any] | None, max_bytes: int,
) -> None:  # fmt: skip
    """shuffle, pack and custom ops: their position is part of every mark (at ``depth``).
    What they emit leaves in blocks of about ``max_bytes`` at most: a shuffle's window is
    one block, and whole windows of large records in every channel after it held several
    times the window (256 KiB records, shuffle(32), an 8 MiB budget: 184 MB of growth)."""
    blocks = counted(source, stats)
    if step.kind == "shuffle":
        seed, warmup = step.fn
        stream = shuffle_blocks(blocks, step.size, seed, lane, depth, resume, warmup)
    elif step.kind == "apply":
        stream = run_apply(step.fn, blocks, lane, depth, resume)
    elif step.kind == "ensure_mixture":
        weights, weight_by, field_, size, surplus = step.fn
        stream = ensure_mixture(blocks, weights, weight_by, field_, size, surplus, lane, depth,
                                resume, stats)  # fmt: skip
    elif step.kind == "batch_per_dataset":
        stream = per_dataset_batches(blocks, step.size, step.drop_last, lane, depth, resume)
    else:
        stream = pack_blocks(blocks, step.fn, lane, depth, resume)
    with closing(out):
        async for block in stream:
            stats.items_out += len(block.items)
            for piece in block.split(-(-block.nbytes // max_bytes)):
                await timed_send(out, piece, stats)

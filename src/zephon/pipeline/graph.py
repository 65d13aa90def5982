"""The running graph of one lane: a spec turned into stages joined by bounded channels.

Per lane::

    planner requests -> group -> fetch (ordered, byte budget) -> decode (loop or pool)
      -> assemble chunks in slot order -> steps (map / filter / tokenize / shuffle / ...)

Each stage kind has its own small function; :func:`build_lane` wires them in a task group
and returns the lane's output channel.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from itertools import compress
from typing import Any

import numpy as np

from zephon.engine.channel import Channel
from zephon.engine.runner import forward, ordered, start_stage, timed_receive
from zephon.engine.stats import StageStats
from zephon.errors import redact_uri
from zephon.ops.block import Block, ChunkRows
from zephon.ops.decode import ChunkAssembler, DecodeJob, decode_job, is_failed, passes_column
from zephon.ops.fetch import Fetched, group_requests, group_reservations, read_group
from zephon.ops.marks import Mark, Residue, new_mark
from zephon.pipeline.handover import residue_end, residue_resume
from zephon.pipeline.resources import Resources, counted
from zephon.pipeline.spec import PipelineSpec
from zephon.pipeline.steps import grower, grows_on_output, start_steps
from zephon.refs import Cursor, RangeRequest
from zephon.storage.gate import CapacityGate

# A read this large, of a codec that decodes without the GIL, is decoded on a thread so the
# loop keeps receiving (a Spark-written Parquet row group of 128 MiB decodes for 100 ms or
# more). Smaller ones are decoded on the loop, which spares a thread hand-off per read (text's
# 2 MB row groups ran at the same speed either way through benchmarks/peers.py's runner,
# quiet and beside a busy process).
OFF_LOOP_BYTES = 8 << 20

__all__ = ["build_lane"]

Decoded = tuple[Fetched, list[Any], list[tuple[int, str]]]  # a read, its samples, failures


def build_lane(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    lane: int,
    resume: dict[str, Any] | None,
    history: list[Any],
) -> Channel[Block]:
    """Start every stage of ``lane`` in ``tg``; returns the channel of its output blocks.
    ``resume`` is the lane's entry of a restored checkpoint (planner state and mark, and the
    residues of old lanes it replays first after a re-laning: :mod:`zephon.pipeline.handover`);
    ``history`` the curriculum's re-laning generations."""
    residues = resume.get("residues", []) if resume is not None else []
    if residues:
        assert resume is not None
        head = res.lane_channel(spec)
        name = f"handover[{lane}]"
        stats = res.stats(name)
        start_stage(tg, name, stats, _handover(tg, spec, res, lane, resume, history, head, stats))
    else:
        head = _segment(tg, spec, res, lane, spec.lanes, resume, history)
    rest = range(spec.stateful_prefix, len(spec.steps))
    return start_steps(tg, spec, res, str(lane), head, rest, lane, None, res.budgets[lane])


def _segment(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    lane: int,
    lanes: int,
    resume: dict[str, Any] | None,
    history: list[Any],
    until: int | None = None,
    tag: str | None = None,
    owner: int | None = None,
) -> Channel[Block]:
    """Lane ``lane`` of ``lanes`` from its planner to its last stateful step (up to the
    lane position ``until``); ``tag`` names its stages, ``owner`` is the lane it feeds."""
    tag = str(lane) if tag is None else tag
    requests = spec.source.requests(
        lane,
        lanes,
        resume=resume["state"] if resume is not None else None,
        history=history,
        until=until,
        window_bytes=spec.read_window_bytes,
        cache_bytes=spec.range_cache_capacity,
    )
    budget = res.budgets[lane if owner is None else owner]  # the share of the lane it feeds
    holding: list[Cursor | None] = [None]  # the chunk the assembler holds items of, if any
    fetched = _fetch(
        tg,
        spec,
        res,
        tag,
        requests,
        budget,
        res.starts.get(lane if owner is None else owner),
        holding,
    )
    decoded = _decode(tg, spec, res, tag, fetched)
    # The lane may read further ahead by what its first step takes from assembly, or, if
    # that step runs on workers, by what the lane delivers (see start_steps).
    on_take = None if grows_on_output(spec) else grower(budget)
    current = res.lane_channel(spec, on_take)
    name = f"assemble[{tag}]"
    stats = res.stats(name)
    start_stage(
        tg, name, stats, _assemble(spec, res, lane, decoded, current, stats, budget, holding)
    )
    mark: Mark | None = resume["mark"] if resume is not None else None
    return start_steps(tg, spec, res, tag, current, range(spec.stateful_prefix), lane, mark, budget)


async def _handover(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    lane: int,
    resume: dict[str, Any],
    history: list[Any],
    out: Channel[Block],
    stats: StageStats,
) -> None:
    """A re-laned lane: each residue handed to it (an old lane replayed from its checkpoint
    up to its cut, its stateful steps flushing what they held), then its own curriculum.
    Residue items are marked with a :class:`Residue` so a checkpoint can say where they are."""
    residues = resume["residues"]

    async def handed() -> AsyncIterator[Block]:
        for k, record in enumerate(residues):
            zeros, at = residue_resume(spec, record)
            rest = tuple(residues[k + 1 :])
            segment = _segment(
                tg,
                spec,
                res,
                int(record["lane"]),
                int(record["lanes"]),
                at,
                history[: int(record["generation"])],
                residue_end(record),
                f"{lane}<{record['lane']}",
                lane,
            )
            async for block in counted(segment, stats):
                marks = [new_mark(lane, Residue(record, m, rest), 0, zeros) for m in block.marks]
                yield Block(lane, block.items, block.refs, marks, block.nbytes, block.extra)
        own = {key: value for key, value in resume.items() if key != "residues"}
        async for block in counted(_segment(tg, spec, res, lane, spec.lanes, own, history), stats):
            yield block

    await forward(handed(), out, stats)


def _fetch(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    lane: str,
    requests: AsyncIterator[RangeRequest],
    budget: CapacityGate,
    start: asyncio.Event | None,
    holding: list[Cursor | None],
) -> Channel[list[Fetched]]:
    """Neighbouring requests grouped into storage reads, up to ``max_inflight_requests`` in
    flight, each holding its bytes in the budget until its samples leave decode. The first
    read waits for ``start`` (the lane's turn to start), if given. Reads of the chunk the
    assembler holds items of (``holding``) may use what it lends the budget, and the reads of
    the lane's opening chunk the whole share, whatever the slow start has reached: the first
    batch needs all of them (a block-shuffled chunk interleaves its runs), and one at a time
    they cost a round trip each (images at +30 ms: first batch 0.64-0.90 s -> 0.59-0.72 s)."""

    opening: list[Cursor | None] = [None]  # the first chunk this run fetches for the lane

    async def read(group: list[RangeRequest]) -> list[Fetched]:
        # One reservation for the group's storage read (admitted alone if it exceeds the
        # budget); each request releases its share once decoded.
        reserved = group_reservations(group)
        await budget.acquire(
            sum(reserved),
            lambda: any(r.cursor == holding[0] for r in group),
            whole=all(r.cursor == opening[0] for r in group),
        )
        try:
            return await read_group(res.storages, group, reserved, res.range_cache)
        except BaseException:
            budget.release(sum(reserved))
            raise

    async def gated(groups: AsyncIterator[list[RangeRequest]]) -> AsyncIterator[list[RangeRequest]]:
        # The wait happens here, before the first read is handed out, never in the read
        # itself: a read that waited there could be overtaken by the next one, which
        # started after the wait was over, took the budget and, delivered in order behind
        # it, never gave it back (a restored run hung so, now and then).
        async for group in groups:
            if start is not None:
                await start.wait()
            if opening[0] is None:
                opening[0] = group[0].cursor
            yield group

    source = spec.source
    groups = gated(group_requests(requests, source.coalesce_gap_bytes, source.max_request_bytes))
    fetched: Channel[list[Fetched]] = res.track(Channel(spec.max_inflight_requests))
    name = f"fetch[{lane}]"
    stats = res.stats(name, str(spec.max_inflight_requests))
    body = ordered(
        tg,
        groups,
        read,
        fetched,
        spec.max_inflight_requests,
        stats,
        deterministic=spec.deterministic,
        size=len,
        ramp=2,
    )
    start_stage(tg, name, stats, body)
    return fetched


def _decode(
    tg: asyncio.TaskGroup,
    spec: PipelineSpec,
    res: Resources,
    lane: str,
    fetched: Channel[list[Fetched]],
) -> Channel[Decoded]:
    """Samples of each read, decoded in the event loop or, ordered, in the worker pool."""
    datasets = spec.source.datasets
    skip = spec.on_error == "skip"

    def job(f: Fetched) -> DecodeJob:
        r = f.request
        ds = datasets[r.dataset]
        return DecodeJob(
            ds.codec,
            ds.shards[r.shard],
            ds.indexes[r.shard],
            f.blob.parts,
            r.samples,
            skip,
            res.storages[r.dataset].cache,
        )

    decoded: Channel[Decoded] = res.track(Channel(max(2, spec.decode_processes * 2)))
    name = f"decode[{lane}]"
    stats = res.stats(name, str(spec.decode_processes or 1))
    pool = res.pool_for(spec.decode_executor)
    if spec.decode_processes:
        assert pool is not None

        async def remote(f: Fetched) -> Decoded:
            items, failed = await pool.run(name, decode_job, job(f))
            return f, items, failed

        body = ordered(
            tg,
            _flatten(fetched),
            remote,
            decoded,
            spec.decode_processes * 2,
            stats,
            deterministic=spec.deterministic,
        )
    else:
        body = _decode_local(fetched, decoded, job, stats)
    start_stage(tg, name, stats, body)
    return decoded


async def _decode_local(
    fetched: Channel[list[Fetched]],
    decoded: Channel[Decoded],
    job: Callable[[Fetched], DecodeJob],
    stats: StageStats,
) -> None:
    async def decoded_reads() -> AsyncIterator[Decoded]:
        while True:
            try:
                group = await timed_receive(fetched, stats)
            except StopAsyncIteration:
                return
            for f in group:
                stats.items_in += 1
                work = job(f)
                large = work.codec.releases_gil and f.blob.nbytes >= OFF_LOOP_BYTES
                if work.codec.reads_itself or large:  # off the loop
                    items, failed = await asyncio.to_thread(decode_job, work)
                else:
                    items, failed = decode_job(work)
                yield (f, items, failed)
                await asyncio.sleep(0)  # each read moves on before the next is decoded

    await forward(decoded_reads(), decoded, stats, size=lambda _: 1)


async def _assemble(
    spec: PipelineSpec,
    res: Resources,
    lane: int,
    decoded: Channel[Decoded],
    out: Channel[Block],
    stats: StageStats,
    budget: CapacityGate,
    holding: list[Cursor | None],
) -> None:
    """Reads' samples back into chunk slot order (or completion order), as blocks; releases
    each read's bytes from the budget and records samples skipped under ``on_error="skip"``.
    What it holds back is lent to the budget for the reads of that chunk (``holding``)."""
    datasets = spec.source.datasets
    ready: list[Block] = []

    def emit(items: list[Any], rows: ChunkRows, failed: bool, nbytes: int) -> None:
        if spec.provenance:
            _add_provenance(datasets, items, rows)
        if failed:  # drop the placeholders of samples skipped under on_error="skip"
            keep = [not is_failed(x) for x in items]
            marks = rows.marks()
            block = Block(
                lane,
                list(compress(items, keep)),
                list(compress(rows.refs(), keep)),
                list(compress(marks, keep)),
                nbytes,
            )
            if marks:
                block.extra["last_mark"] = marks[-1]
        else:
            block = Block(lane, items, nbytes=nbytes, rows=rows)
        ready.append(block)

    assembler = ChunkAssembler(lane, emit, spec.block_bytes)

    async def blocks() -> AsyncIterator[Block]:
        while True:
            try:
                f, items, failed = await timed_receive(decoded, stats)
            except StopAsyncIteration:
                break
            budget.release(f.reserved)
            r = f.request
            stats.items_in += 1
            for pos, message in failed:
                res.ledger.add(datasets[r.dataset].name, r.uri, int(r.samples[pos]), message)
            if spec.deterministic:
                held = assembler.held
                assembler.add(
                    r.cursor,
                    r.slots,
                    items,
                    r.dataset,
                    r.shard,
                    r.samples,
                    bool(failed),
                    f.reserved,
                    r.passes,
                )
                # What the assembler holds back waits for other reads of the chunk (its runs
                # interleave): lent to the slow start while held, so those reads get in.
                holding[0] = r.cursor if assembler.held else None
                budget.lend(assembler.held - held)
            else:
                n = len(r.samples)
                rows = ChunkRows(
                    lane,
                    r.cursor,
                    np.full(n, r.dataset),
                    np.full(n, r.shard),
                    r.samples,
                    r.slots + 1,
                    passes_column(r.passes),
                )
                emit(items, rows, bool(failed), f.reserved)
            while ready:
                yield ready.pop(0)
        budget.lend(-assembler.held)
        assembler.flush()
        while ready:
            yield ready.pop(0)

    await forward(blocks(), out, stats)


def _add_provenance(datasets: Any, items: list[Any], rows: ChunkRows) -> None:
    """``item["_provenance"]``: where each dict sample came from (failed placeholders and
    non-dict samples are left alone)."""
    for item, d, s, i in zip(
        items, rows.dataset.tolist(), rows.shard.tolist(), rows.sample.tolist(), strict=True
    ):
        if isinstance(item, dict):
            ds = datasets[d]
            shard = redact_uri(ds.shards[s].uri)  # a presigned URL's signature masked
            item["_provenance"] = {"dataset": ds.name, "shard": shard, "sample": i}


async def _flatten(source: Channel[list[Fetched]]) -> AsyncIterator[Fetched]:
    async for group in source:
        for fetched in group:
            yield fetched

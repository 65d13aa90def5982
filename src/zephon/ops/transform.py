"""map, filter and apply: user functions over a lane's samples, block by block."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from typing import Any

from zephon.errors import StateMismatch
from zephon.ops.block import Block, Mark, Provenance, high_water, ref_at
from zephon.ops.shuffle import start_mark

__all__ = ["apply_block", "filter_batch", "map_batch", "run_apply"]


def _describe(ref: Any) -> str:
    if isinstance(ref, tuple) and len(ref) == 3:
        return f"dataset #{ref[0]}, shard {ref[1]}, sample {ref[2]}"
    return repr(ref)


def map_batch(fn: Callable[[Any], Any], items: list[Any], refs: Provenance) -> list[Any]:
    """``fn`` over a block's items; an error keeps its type and names the sample."""
    out: list[Any] = []
    append = out.append
    try:
        for item in items:
            append(fn(item))
    except Exception as exc:
        where = _describe(ref_at(refs, len(out)))
        exc.add_note(f"zephon: map {getattr(fn, '__name__', fn)!r} failed on {where}")
        raise
    return out


def filter_batch(pred: Callable[[Any], Any], items: list[Any], refs: Provenance) -> list[bool]:
    out: list[bool] = []
    append = out.append
    try:
        for item in items:
            append(bool(pred(item)))
    except Exception as exc:
        where = _describe(ref_at(refs, len(out)))
        exc.add_note(f"zephon: filter {getattr(pred, '__name__', pred)!r} failed on {where}")
        raise
    return out


def tokenize_batch(tok: Any, items: list[Any], refs: Provenance) -> list[Any]:
    try:
        return list(tok.batch(items))
    except Exception as exc:
        at = getattr(exc, "zephon_index", None)
        where = (f"on {_describe(ref_at(refs, at))}" if at is not None
                 else f"in a block starting at {_describe(ref_at(refs, 0))}")  # fmt: skip
        exc.add_note(f"zephon: tokenize failed {where}")
        raise


async def apply_block(
    kind: str,
    fn: Callable[[Any], Any],
    block: Block,
    pool: Any,
    stage_name: str,
    executor: Executor | None = None,
) -> Block:
    """One block through a map or filter, in process, awaited, or in the worker pool."""
    if kind == "tokenize":
        if pool is None and executor is not None and getattr(fn, "releases_gil", False):
            # The encoder runs without the GIL: the loop decodes and packs other blocks
            # meanwhile.
            loop = asyncio.get_running_loop()
            results = await loop.run_in_executor(
                executor, tokenize_batch, fn, block.items, block.provenance()
            )
        elif pool is not None:
            results = await pool.run(
                stage_name, tokenize_batch, fn, block.items, block.provenance()
            )
        else:
            results = tokenize_batch(fn, block.items, block.provenance())
        return block.with_items(results)
    if pool is not None:
        worker = map_batch if kind == "map" else filter_batch
        results = await pool.run(stage_name, worker, fn, block.items, block.provenance())
    elif inspect.iscoroutinefunction(fn):
        results = []
        for item, ref in zip(block.items, block.refs, strict=True):
            try:
                value = await fn(item)
            except Exception as exc:
                exc.add_note(
                    f"zephon: {kind} {getattr(fn, '__name__', fn)!r} failed on {_describe(ref)}"
                )
                raise
            results.append(bool(value) if kind == "filter" else value)
    else:
        worker = map_batch if kind == "map" else filter_batch
        args = (fn, block.items, block.provenance())
        if executor is None:
            results = worker(*args)
        else:  # off the loop: fetching and delivery go on meanwhile
            results = await asyncio.get_running_loop().run_in_executor(executor, worker, *args)
    if kind == "map":
        keep = [r is not None for r in results]  # a map returning None drops the sample
        items = [r for r in results if r is not None]
    else:
        keep = results
        items = [x for x, k in zip(block.items, keep, strict=True) if k]
    if all(keep):
        return block.with_items(items)
    refs = [r for r, k in zip(block.refs, keep, strict=True) if k]
    marks = [m for m, k in zip(block.marks, keep, strict=True) if k]
    out = block.replace(items, refs, marks)
    if not items and block.marks:
        out.extra["last_mark"] = block.marks[-1]  # an emptied block still moves the lane on
    return out


def is_stateful(op: Any) -> bool:
    """A custom op is stateful if it has ``state() -> dict`` and ``restore(dict)``."""
    return callable(getattr(op, "state", None)) and callable(getattr(op, "restore", None))


async def run_apply(
    op: Callable[[AsyncIterator[Any]], AsyncIterator[Any]],
    blocks: AsyncIterator[Block],
    lane: int,
    depth: int = 0,
    resume: tuple[Mark, Any] | None = None,
) -> AsyncIterator[Block]:
    """Adapt a user's per-item async generator to blocks, with exact resume.

    The user's generator sees single items. Outputs are grouped into a new block whenever the
    generator asks for the next input block. Each output is marked so that a checkpoint taken
    right after it resumes exactly:

    - a stateful op (``state()``/``restore()``): the position after the last input it took,
      with ``{"state": op.state()}`` taken right after the output was yielded (every lane,
      in every run, works on its own deep copy of the op);
    - any other op is taken to be stateless (its outputs depend only on the latest input): the
      position *before* that input, with the number of outputs it has produced since, which
      are skipped when the input is fed again on resume.

    Long because both kinds of op share one feeding loop and its resume skip.
    """
    stateful = is_stateful(op)
    if stateful:  # each lane, in each run, has its own copy, fresh from the pipeline's
        op = copy.deepcopy(op)
    skip = 0
    if resume is not None:
        _, entry = resume
        if isinstance(entry, dict):
            if not stateful:
                raise StateMismatch("checkpoint holds a custom op's state; this op has none")
            op.restore(entry["state"])  # type: ignore[attr-defined]
        else:
            skip = int(entry)
    start = resume[0] if resume is not None else start_mark(lane, depth)
    # mark: after the last input taken; before: before it; since: outputs produced since.
    last: dict[str, Any] = {"mark": start, "before": start, "since": 0, "ref": None}
    produced: list[tuple[Any, Any, Any]] = []
    ready: list[Block] = []

    async def items() -> AsyncIterator[Any]:
        async for block in blocks:
            if produced:
                ready.append(_block_of(lane, produced))
                produced.clear()
            for item, ref, mark in zip(block.items, block.refs, block.marks, strict=True):
                last["before"], last["mark"], last["since"], last["ref"] = (
                    last["mark"],
                    mark,
                    0,
                    ref,
                )
                yield item

    stream = op(items())
    async for out in stream:
        last["since"] += 1
        if skip:  # produced before the checkpoint: the consumer has it already
            skip -= 1
            continue
        if stateful:
            m = last["mark"]
            state = {"state": op.state()}  # type: ignore[attr-defined]
            mark = (*m[:3], (*m[3], state), high_water(m))
        else:
            b = last["before"]
            mark = (*b[:3], (*b[3], last["since"]), high_water(last["mark"]))
        produced.append((out, last["ref"], mark))
        while ready:
            yield ready.pop(0)
    if produced:
        ready.append(_block_of(lane, produced))
    for block in ready:
        yield block


def _block_of(lane: int, produced: list[tuple[Any, Any, Any]]) -> Block:
    return Block(lane, [p[0] for p in produced], [p[1] for p in produced], [p[2] for p in produced])

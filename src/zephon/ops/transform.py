"""map, filter and apply: user functions over a lane's samples, block by block."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.context import PASS, item_passes
from zephon.errors import FormatError, StateMismatch
from zephon.ops.block import Block, Provenance, ref_at
from zephon.ops.marks import Mark, high_water, start_mark, with_state
from zephon.ops.operator import LaneContext, StreamOperator, is_count
from zephon.ops.windows import REPLAYED

__all__ = ["Apply", "Chain", "apply_block", "run_apply", "run_batch", "tokenize_block"]


def _describe(ref: Any) -> str:
    if isinstance(ref, tuple) and len(ref) == 4:
        where = f"dataset #{ref[0]}, shard {ref[1]}, sample {ref[2]}"
        return f"{where} (pass {ref[3]})" if ref[3] else where
    return repr(ref)


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", fn))


class Chain:
    """Adjacent map and filter steps run as one call per block in the same worker, so a
    sample crosses processes once (decoded images are large: never twice). Picklable when
    its steps are. ``None`` from a map, or a false filter, drops the sample."""

    def __init__(self, steps: list[tuple[str, Callable[[Any], Any]]]) -> None:
        self.steps = steps
        self.__name__ = " -> ".join(f"{kind} {_name(fn)}" for kind, fn in steps)
        self._calls = _fused(steps)
        self.releases_gil = all(getattr(fn, "releases_gil", False) for _, fn in steps)

    def __call__(self, item: Any) -> Any:
        for kind, fn in self._calls:
            try:
                value = fn(item)
            except Exception as exc:
                exc.zephon_step = (kind, fn)  # type: ignore[attr-defined]
                raise
            if kind == "filter":
                if not value:
                    return None
            elif value is None:
                return None
            else:
                item = value
        return item


def _fused(steps: list[tuple[str, Callable[[Any], Any]]]) -> list[tuple[str, Any]]:
    """``steps`` with each pair of maps that does less work as one call (a step's
    ``fused_with(next)``: a decode then a crop of the image decodes only the crop) fused;
    the result is the same."""
    out: list[tuple[str, Any]] = []
    for kind, fn in steps:
        if kind == "map" and out and out[-1][0] == "map":
            fuse = getattr(out[-1][1], "fused_with", None)
            both = fuse(fn) if fuse is not None else None
            if both is not None:
                out[-1] = ("map", both)
                continue
        out.append((kind, fn))
    return out


def run_batch(
    kind: str,
    fn: Callable[[Any], Any],
    items: list[Any],
    refs: Provenance,
    skip: bool = False,
    offset: int = 0,
) -> tuple[list[Any], list[tuple[int, str]]]:
    """``fn`` over a block's items: a map's results (``None`` drops the sample) or a filter's
    verdicts. An error keeps its type and names the step and the sample. With ``skip``, a
    :class:`~zephon.errors.FormatError` (bad input, e.g. a corrupt image) drops its sample
    instead and comes back as ``(position, message)``. ``items`` may be a piece of the block
    that starts at ``offset`` (``refs`` are the whole block's)."""
    passes = item_passes(refs, offset, len(items))
    block_pass = PASS.set(passes) if isinstance(passes, int) and passes else None
    try:
        return _run_items(kind, fn, items, refs, skip, offset, passes)
    finally:
        if block_pass is not None:
            PASS.reset(block_pass)


def _run_items(
    kind: str,
    fn: Callable[[Any], Any],
    items: list[Any],
    refs: Provenance,
    skip: bool,
    offset: int,
    passes: int | list[int],
) -> tuple[list[Any], list[tuple[int, str]]]:
    """:func:`run_batch`'s loop; ``passes``: the items' passes, one per item or shared."""
    out: list[Any] = []
    failed: list[tuple[int, str]] = []
    is_filter = kind == "filter"
    per_item = isinstance(passes, list)
    for pos, item in enumerate(items, offset):
        entered = PASS.set(passes[pos - offset]) if per_item else None  # type: ignore[index]
        try:
            value = fn(item)
        except Exception as exc:
            step_kind, step_fn = getattr(exc, "zephon_step", (kind, fn))
            if skip and isinstance(exc, FormatError):
                failed.append((pos - offset, f"{step_kind} {_name(step_fn)!r}: {exc}"))
                out.append(False if is_filter else None)
                continue
            ref = ref_at(refs, pos)
            exc.add_note(f"zephon: {step_kind} {_name(step_fn)!r} failed on {_describe(ref)}")
            if isinstance(exc, FormatError):  # bad input: the pipeline names where it is
                exc.zephon_ref = ref  # type: ignore[attr-defined]
            raise
        finally:
            if entered is not None:
                PASS.reset(entered)
        out.append(bool(value) if is_filter else value)
    return out, failed


def tokenize_batch(tok: Any, items: list[Any], refs: Provenance) -> list[Any]:
    try:
        return list(tok.batch(items))
    except Exception as exc:
        at = getattr(exc, "zephon_index", None)
        where = (
            f"on {_describe(ref_at(refs, at))}"
            if at is not None
            else f"in a block starting at {_describe(ref_at(refs, 0))}"
        )
        exc.add_note(f"zephon: {getattr(tok, 'step', 'tokenize')} failed {where}")
        raise


async def apply_block(
    kind: str,
    fn: Callable[[Any], Any],
    block: Block,
    pool: Any,
    stage_name: str,
    executor: Executor | None = None,
    on_skip: Callable[[Any, str], None] | None = None,
) -> Block:
    """One block through a map or filter, in process, awaited, or in the worker pool.
    ``on_skip(ref, message)``: skip samples whose step raised ``FormatError`` (bad input)
    and report each; without it such an error ends the run like any other."""
    skip = on_skip is not None
    if pool is not None:
        gil_free = getattr(fn, "releases_gil", False)  # threads may run it: WorkerPool.run
        results, failed = await pool.run(
            stage_name,
            run_batch,
            kind,
            fn,
            block.items,
            block.provenance(),
            skip,
            gil_free=gil_free,
        )
    elif inspect.iscoroutinefunction(fn):
        results, failed = await _await_each(kind, fn, block, skip)
    else:
        args = (kind, fn, block.items, block.provenance(), skip)
        if executor is None:
            results, failed = run_batch(*args)
        else:  # off the loop: fetching and delivery go on meanwhile
            loop = asyncio.get_running_loop()
            results, failed = await loop.run_in_executor(executor, run_batch, *args)
    for pos, message in failed:
        assert on_skip is not None
        on_skip(ref_at(block.provenance(), pos), message)
    if kind == "map":
        keep = [r is not None for r in results]  # a map returning None drops the sample
        items = [r for r in results if r is not None]
    else:
        keep = results
        items = [x for x, k in zip(block.items, keep, strict=True) if k]
    return block.kept(keep, items)


async def tokenize_block(
    fn: Any, block: Block, pool: Any, stage_name: str, executor: Executor | None = None
) -> Block:
    """One block through a tokenizer, in process, on ``executor`` (a tokenizer that
    releases the GIL: the loop decodes and packs other blocks meanwhile) or in the worker
    pool. Items a restored shuffle will skip (:data:`~zephon.ops.windows.REPLAYED`) pass
    untouched."""
    if any(x is REPLAYED for x in block.items):
        keep = [x is not REPLAYED for x in block.items]
        real = [x for x in block.items if x is not REPLAYED]
        if not real:
            return block
        done = await tokenize_block(fn, block.kept(keep, real), pool, stage_name, executor)
        encoded = iter(done.items)
        return block.with_items([x if x is REPLAYED else next(encoded) for x in block.items])
    if pool is None and executor is not None and getattr(fn, "releases_gil", False):
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(
            executor, tokenize_batch, fn, block.items, block.provenance()
        )
    elif pool is not None:
        results = await pool.run(stage_name, tokenize_batch, fn, block.items, block.provenance())
    else:
        results = tokenize_batch(fn, block.items, block.provenance())
    return block.with_items(results)


async def _await_each(
    kind: str, fn: Callable[[Any], Any], block: Block, skip: bool
) -> tuple[list[Any], list[tuple[int, str]]]:
    """:func:`run_batch` for an async function, awaited item by item in the loop."""
    results: list[Any] = []
    failed: list[tuple[int, str]] = []
    for item, ref in zip(block.items, block.refs, strict=True):
        entered = PASS.set(ref[3]) if isinstance(ref, tuple) and len(ref) == 4 else None
        try:
            value = await fn(item)
        except Exception as exc:
            if skip and isinstance(exc, FormatError):
                failed.append((len(results), f"{kind} {_name(fn)!r}: {exc}"))
                results.append(False if kind == "filter" else None)
                continue
            exc.add_note(f"zephon: {kind} {_name(fn)!r} failed on {_describe(ref)}")
            if isinstance(exc, FormatError):
                exc.zephon_ref = ref  # type: ignore[attr-defined]
            raise
        finally:
            if entered is not None:
                PASS.reset(entered)
        results.append(bool(value) if kind == "filter" else value)
    return results, failed


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
    # mark: after the last input taken; before: before it; since: outputs produced since;
    # per_item: fetched bytes per input of the latest block.
    last: dict[str, Any] = {
        "mark": start,
        "before": start,
        "since": 0,
        "ref": None,
        "per_item": 0.0,
    }
    produced: list[tuple[Any, Any, Any]] = []
    ready: list[Block] = []

    async def items() -> AsyncIterator[Any]:
        async for block in blocks:
            if produced:
                ready.append(_block_of(lane, produced, last["per_item"]))
                produced.clear()
            last["per_item"] = block.nbytes / len(block.items) if block.items else 0.0
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
            mark = with_state(m, {"state": op.state()}, high_water(m))  # type: ignore[attr-defined]
        else:
            mark = with_state(last["before"], last["since"], high_water(last["mark"]))
        produced.append((out, last["ref"], mark))
        while ready:
            yield ready.pop(0)
    if produced:
        ready.append(_block_of(lane, produced, last["per_item"]))
    for block in ready:
        yield block


def _block_of(lane: int, produced: list[tuple[Any, Any, Any]], per_item: float) -> Block:
    """The outputs as a block, weighing the fetched bytes of as many inputs."""
    return Block(
        lane,
        [p[0] for p in produced],
        [p[1] for p in produced],
        [p[2] for p in produced],
        int(per_item * len(produced)),
    )


@dataclass(frozen=True)
class Apply(StreamOperator):
    """``apply(op)``: a custom operator over a lane's items (see :func:`run_apply`). Its
    position is part of every checkpoint whether or not the op keeps state of its own."""

    name: ClassVar[str] = "apply"
    stateful: ClassVar[bool] = True
    per_item: ClassVar[bool] = True

    fn: Callable[[AsyncIterator[Any]], AsyncIterator[Any]]

    def label(self) -> str:
        return f"apply({_name_of(self.fn)}; in process)"

    def run_now(self, samples: list[Any]) -> list[Any] | None:
        return None  # an async generator over a stream: only a run runs it

    def check_state(self, state: Any) -> None:
        if not is_count(state) and not (isinstance(state, dict) and state.keys() == {"state"}):
            raise ValueError('outputs to skip, or a stateful op\'s {"state": ...}')

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return run_apply(self.fn, blocks, lane.lane, lane.depth, lane.resume)


def _name_of(fn: Any) -> str:
    """How a step's function is named in its label."""
    return str(getattr(fn, "__name__", type(fn).__name__))

"""Item operators: map, filter and tokenize, functions over a lane's items a block at a time.

Unlike a stream operator, an item operator may run off the event loop: on the run's helper
thread, in the worker pool (``processes``) or on Ray actors (``executor``). Its stage
(:mod:`zephon.pipeline.steps`) hands it each block with where to run it; the operator
applies itself (:meth:`ItemOperator.apply`). Where it runs never changes what it outputs,
so its checkpoint identity leaves placement out.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from zephon.ops.block import Block
from zephon.ops.operator import Operator, placement_label
from zephon.ops.transform import apply_block, tokenize_block

__all__ = ["BatchedMap", "ColumnBatches", "Filter", "ItemOperator", "Map", "Tokenize"]


@dataclass(frozen=True)
class ItemOperator(Operator):
    """A function over items, placed in the loop, on workers or on Ray actors.

    Class attributes:
        fusable: adjacent fusable operators on the same workers run as one call per block.
        one_to_one: one output per input, never dropped: the stand-ins of items a restored
            shuffle will skip can pass through it.
    """

    per_item: ClassVar[bool] = True
    fusable: ClassVar[bool] = False
    one_to_one: ClassVar[bool] = False

    fn: Any
    processes: int = 0  # a field here, a read-only property on Operator
    executor: Any = None

    def identity(self) -> str:
        return dataclasses.replace(self, processes=0, executor=None).label()

    async def apply(
        self,
        block: Block,
        pool: Any,
        stage_name: str,
        executor: Executor | None = None,
        on_skip: Callable[[Any, str], None] | None = None,
    ) -> Block:
        """``block`` through the operator: in ``pool`` when given, else on ``executor`` (the
        run's helper thread) or in the loop. ``on_skip``: see
        :func:`~zephon.ops.transform.apply_block`."""
        raise NotImplementedError


@dataclass(frozen=True)
class _PerItem(ItemOperator):
    """A map or filter: ``fn`` called on each item (sync or async)."""

    kind: ClassVar[Literal["map", "filter"]]
    fusable: ClassVar[bool] = True

    def label(self) -> str:
        name = getattr(self.fn, "__name__", type(self.fn).__name__)
        return f"{self.kind}({name}; {placement_label(self.processes, self.executor)})"

    async def apply(
        self,
        block: Block,
        pool: Any,
        stage_name: str,
        executor: Executor | None = None,
        on_skip: Callable[[Any, str], None] | None = None,
    ) -> Block:
        return await apply_block(self.kind, self.fn, block, pool, stage_name, executor, on_skip)

    def run_now(self, samples: list[Any]) -> list[Any] | None:
        if inspect.iscoroutinefunction(self.fn):
            return None
        if self.kind == "map":  # None drops the sample
            return [y for y in map(self.fn, samples) if y is not None]
        return [x for x in samples if self.fn(x)]


@dataclass(frozen=True)
class Map(_PerItem):
    """``map(fn)``: ``fn(sample) -> sample | None`` (``None`` drops the sample)."""

    name: ClassVar[str] = "map"
    kind: ClassVar[Literal["map", "filter"]] = "map"


@dataclass(frozen=True)
class Filter(_PerItem):
    """``filter(pred)``: keeps the samples for which ``pred(sample)`` is true."""

    name: ClassVar[str] = "filter"
    kind: ClassVar[Literal["map", "filter"]] = "filter"


@dataclass(frozen=True)
class Tokenize(ItemOperator):
    """``tokenize`` / ``tokenize_chat``: ``fn`` encodes a block of samples at once
    (``fn.batch(items)``; see :mod:`zephon.ops.tokenize` and :mod:`zephon.ops.chat`)."""

    name: ClassVar[str] = "tokenize"
    one_to_one: ClassVar[bool] = True

    def label(self) -> str:
        where = placement_label(self.processes, self.executor)
        t = self.fn
        if hasattr(t, "describe"):
            return f"{t.describe()[:-1]}; {where})"
        return (
            f"tokenize({t.kind}, field={t.field!r}, max_length={t.max_length}, "
            f"bos={t.bos}, eos={t.eos}; {where})"
        )

    def run_now(self, samples: list[Any]) -> list[Any] | None:
        return list(self.fn.batch(samples))

    async def apply(
        self,
        block: Block,
        pool: Any,
        stage_name: str,
        executor: Executor | None = None,
        on_skip: Callable[[Any, str], None] | None = None,
    ) -> Block:
        return await tokenize_block(self.fn, block, pool, stage_name, executor)


class ColumnBatches:
    """A Hugging Face style batched function over rows: ``fn`` takes a batch as a dict of
    lists (one per column, union of the rows' keys, ``None`` where a row lacks one) and
    returns a dict of lists, each as long as the batch; the returned columns are merged
    into the rows (replacing columns of the same name), after ``remove_columns`` are
    dropped. ``None`` returned leaves the rows as they are (but for removed columns).

    Raises (at run time, naming the function): a result that is not a mapping, or a column
    whose length differs from the batch's (to drop or add rows use ``filter`` or ``apply``).
    """

    step = "map"

    def __init__(self, fn: Any, remove_columns: tuple[str, ...], batch_size: int | None) -> None:
        self.fn, self.remove, self.batch_size = fn, remove_columns, batch_size

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", type(self.fn).__name__)

    def batch(self, rows: list[Any]) -> list[Any]:
        size = self.batch_size or max(1, len(rows))
        out: list[Any] = []
        for a in range(0, len(rows), size):
            out += self._one(rows[a : a + size])
        return out

    def _one(self, rows: list[Any]) -> list[Any]:
        keys: dict[str, None] = {}
        for row in rows:
            if not isinstance(row, dict):
                raise TypeError(
                    f"map(batched=True): {self.name!r} needs rows that are dicts, got "
                    f"{type(row).__name__}"
                )
            keys.update(dict.fromkeys(row))
        columns = {k: [row.get(k) for row in rows] for k in keys}
        result = self.fn(columns)
        if inspect.isawaitable(result):
            raise TypeError(f"map(batched=True): {self.name!r} must be a plain function")
        if result is None:
            result = {}
        if not hasattr(result, "items"):
            raise TypeError(
                f"map(batched=True): {self.name!r} must return a dict of columns, got "
                f"{type(result).__name__}"
            )
        for key, values in result.items():
            if len(values) != len(rows):
                raise ValueError(
                    f"map(batched=True): {self.name!r} returned {len(values)} values of column "
                    f"{key!r} for a batch of {len(rows)}: a batched map gives one row per row "
                    "(drop rows with filter(), split them with apply())"
                )
        out = []
        for i, row in enumerate(rows):
            new = {k: v for k, v in row.items() if k not in self.remove}
            new.update({k: values[i] for k, values in result.items()})
            out.append(new)
        return out


@dataclass(frozen=True)
class BatchedMap(ItemOperator):
    """``map(fn, batched=True)``: ``fn`` over a block's rows as columns
    (:class:`ColumnBatches`), one row out per row in."""

    name: ClassVar[str] = "map"
    one_to_one: ClassVar[bool] = True

    def label(self) -> str:
        f = self.fn
        removed = f", remove_columns={list(f.remove)}" if f.remove else ""
        size = f", batch_size={f.batch_size}" if f.batch_size else ""
        where = placement_label(self.processes, self.executor)
        return f"map({f.name}, batched=True{size}{removed}; {where})"

    def run_now(self, samples: list[Any]) -> list[Any] | None:
        return self.fn.batch(samples)  # type: ignore[no-any-return]

    async def apply(
        self,
        block: Block,
        pool: Any,
        stage_name: str,
        executor: Executor | None = None,
        on_skip: Callable[[Any, str], None] | None = None,
    ) -> Block:
        return await tokenize_block(self.fn, block, pool, stage_name, executor)

"""Operators: each step of a pipeline's chain is one small typed object.

An operator is a frozen dataclass (its configuration) that knows its label, whether it is
stateful, where it may run and how it runs over a lane's stream. The builder's verbs
construct them; the stages (:mod:`zephon.pipeline.steps`) run them through this interface
and nothing else, so a new operator is its module and its builder verb.

Two shapes:

- :class:`StreamOperator` runs in the event loop over a lane's blocks:
  ``run(blocks, lane) -> blocks``, an async generator (shuffle, pack, batch, apply...). The
  stage around it counts, bounds and forwards what it yields.
- :class:`ItemOperator` (in :mod:`zephon.ops.transform`) is a function over items, a block
  at a time, which the stage runs in the loop, on the helper thread, in worker processes or
  on Ray actors, as placed (map, filter, tokenize).

State. A stateful operator's state travels in the marks of the items it emits (see
:mod:`zephon.ops.marks`): each output's mark is the mark it saw, with the operator's own
state appended (``with_state``), so a checkpoint taken after any item holds every
operator's state at that item and nothing buffered. On a restore the stage hands the
operator ``lane.resume``: the mark just before its window as the operators before it saw
it, and its own state from the checkpoint; the operator replays from there.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.engine.stats import StageStats
from zephon.ops.block import Block
from zephon.ops.marks import Mark

__all__ = [
    "LaneContext",
    "Operator",
    "StreamOperator",
    "check_counts",
    "is_count",
    "placement_label",
]


@dataclass(frozen=True)
class LaneContext:
    """What a stream operator runs with, in one lane of one run.

    Attributes:
        lane: the lane.
        depth: stateful operators before this one (where its state sits in a mark).
        resume: for a stateful operator after a restore: the mark before its window as the
            operators before it saw it, and its own state; ``None`` on a fresh start.
        stats: the stage's counters (an operator may count what it drops).
        storages: the run's storage clients, one per dataset (for operators that read).
        datasets: the datasets, in the same order.
        on_skip: ``on_skip(ref, message)`` under ``on_error="skip"``, else ``None``.
    """

    lane: int
    depth: int
    resume: tuple[Mark, Any] | None
    stats: StageStats
    storages: Sequence[Any] = ()
    datasets: Sequence[Any] = ()
    on_skip: Callable[[Any, str], None] | None = None


def is_count(value: Any) -> bool:
    """A non-negative ``int`` (not a ``bool``): what most operator states are."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_counts(value: Any, what: str) -> None:
    """``value`` maps digit strings (datasets) to counts, as the per-dataset skips do.

    Raises:
        ValueError: it does not.
    """
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and k.isdigit() and is_count(v) for k, v in value.items()
    ):
        raise ValueError(f"{what}: counts by dataset")


def placement_label(processes: int, executor: Any) -> str:
    """Where a step runs, for ``explain()``."""
    if executor is not None:
        return f"{executor!r}, {processes} blocks in flight per lane"
    return f"{processes} processes" if processes else "in process"


class Operator:
    """What every operator says about itself.

    Class attributes:
        name: how its stages are named in ``stats()`` (``shuffle#3[0]``).
        stateful: its position is part of every checkpoint (it holds items across blocks).
        per_item: it works per item, so a lane whose item work runs in this process starts
            its read-ahead small (see :func:`zephon.pipeline.run`'s budgets).
        batches: it turns items into batches (steps on items must come before it).
        changeable: the settings a restore may change (a checkpoint taken under
            ``batch(8)`` restores under ``batch(16)``); the checkpoint records their values
            and :meth:`adapt` turns the operator's state into the new settings' terms.
    """

    name: ClassVar[str]
    stateful: ClassVar[bool] = False
    per_item: ClassVar[bool] = False
    batches: ClassVar[bool] = False
    changeable: ClassVar[tuple[str, ...]] = ()

    @property
    def processes(self) -> int:
        """Blocks in flight per lane off the event loop (0: in it)."""
        return 0

    @property
    def executor(self) -> Any:
        """A :class:`zephon.executors.Ray` the operator runs on, or ``None``."""
        return None

    def label(self) -> str:
        """How the operator appears in ``explain()``."""
        raise NotImplementedError

    def identity(self) -> str:
        """The operator as a checkpoint knows it: where it runs does not change its output."""
        return self.label()

    def settings(self) -> dict[str, Any]:
        """The values of the :attr:`changeable` settings, as a checkpoint records them."""
        return {name: getattr(self, name) for name in self.changeable}

    def adapt(self, state: Any, old: Operator) -> Any:
        """This operator's state in a checkpoint taken under ``old`` (the same operator with
        other :attr:`changeable` settings), in this operator's terms. The default keeps it:
        right for a stateless operator and for a state that counts inputs, not outputs.

        Raises:
            StateMismatch: the change cannot be exact (saying why).
        """
        return state

    def check_state(self, state: Any) -> None:
        """Refuse a state from a checkpoint that this operator never writes (a corrupted
        checkpoint must not fail mid-run or restart the stream). The default takes a count
        or an object.

        Raises:
            ValueError: saying what the state should be.
        """
        if not (is_count(state) or isinstance(state, dict)):
            raise ValueError("a count or an object")

    def holds_items(self) -> bool:
        """Whether it holds items back until it has many (a lane's read-ahead grows by the
        output of the step before it; see :func:`zephon.pipeline.steps.growth_step`)."""
        return self.stateful

    def replay_skips(self, lane: int, resume: tuple[Mark, Any]) -> np.ndarray | None:
        """After a restore, the positions (from the replayed window's start) of the inputs
        it will skip, if it knows them before reading (a shuffle); else ``None``."""
        return None

    def run_now(self, samples: list[Any]) -> list[Any] | None:
        """``samples`` through the operator, synchronously, outside a run (to measure a
        tokenizer's tokens per byte); ``None`` if it cannot. Order-only operators return
        them unchanged."""
        return samples


class StreamOperator(Operator):
    """An operator over a lane's stream of blocks, run in the event loop."""

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        """The operator's output blocks from its input ``blocks`` in ``lane``."""
        raise NotImplementedError

"""Marks: where an item leaves its lane, which is what a checkpoint stores per lane.

A mark is a plain tuple ``(lane, cursor, delivered, ops, hw)``:

- ``lane``: the lane the item left;
- ``cursor``: the chunk it came from (a :class:`~zephon.refs.Cursor`), a :class:`Residue`
  when it came from a residue handed over by re-laning, or ``None`` at the lane's start;
- ``delivered``: pointers of that chunk delivered up to and including the item;
- ``ops``: the states of the stateful operators it passed, in chain order (what each must
  skip on a restore, or a custom operator's ``{"state": ...}``);
- ``hw``: the high water, ``None`` if the stateful operators had taken no input past the
  position, else the ``(cursor, delivered)`` of the furthest input they had taken.

It stays a plain tuple because marks are built per item on the hot path: a tuple literal
costs 25 ns, a ``NamedTuple`` 140 ns (measured, CPython 3.12). Code reads a mark through the
functions here, never by position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zephon.refs import Cursor

__all__ = [
    "Mark",
    "Position",
    "Residue",
    "cursor_of",
    "delivered_of",
    "for_op",
    "high_water",
    "hw_of",
    "lane_of",
    "new_mark",
    "op_states",
    "position_of",
    "start_mark",
    "with_state",
]

Position = tuple["Cursor | Residue | None", int]  # (chunk cursor, pointers of it delivered)
Mark = tuple[int, "Cursor | Residue | None", int, tuple[Any, ...], Position | None]


@dataclass(frozen=True, slots=True)
class Residue:
    """In place of a cursor: the item comes from a residue handed over by re-laning (see
    :mod:`zephon.pipeline.handover`). ``record`` is the residue as the checkpoint stores it,
    ``at`` the item's mark in the old lane, ``rest`` the residues still to come after it."""

    record: dict[str, Any]
    at: Mark
    rest: tuple[dict[str, Any], ...]


def new_mark(
    lane: int,
    cursor: Cursor | Residue | None,
    delivered: int,
    ops: tuple[Any, ...] = (),
    hw: Position | None = None,
) -> Mark:
    """A mark from its parts (see the module doc)."""
    return (lane, cursor, delivered, ops, hw)


def start_mark(lane: int, depth: int) -> Mark:
    """The mark of "nothing consumed yet" in ``lane``, as an operator with ``depth``
    stateful operators before it sees it."""
    return (lane, None, 0, (0,) * depth, None)


def lane_of(mark: Mark) -> int:
    return mark[0]


def cursor_of(mark: Mark) -> Cursor | Residue | None:
    return mark[1]


def delivered_of(mark: Mark) -> int:
    return mark[2]


def position_of(mark: Mark) -> Position:
    """``(cursor, delivered)``: where in the lane the item left."""
    return (mark[1], mark[2])


def op_states(mark: Mark) -> tuple[Any, ...]:
    """The states of the stateful operators the item passed, in chain order."""
    return mark[3]


def hw_of(mark: Mark) -> Position | None:
    """The high water as recorded: ``None`` when the stateful ops held nothing past the
    item (see :func:`high_water`)."""
    return mark[4]


def high_water(mark: Mark) -> Position:
    """How far into the lane the stateful ops had read when the item of ``mark`` left them:
    replaying the lane from the mark's position up to there gives the same items."""
    return mark[4] if mark[4] is not None else (mark[1], mark[2])


def with_state(mark: Mark, state: Any, hw: Position | None) -> Mark:
    """``mark`` as it leaves a stateful operator: that operator's ``state`` appended, and
    the high water ``hw``."""
    return (mark[0], mark[1], mark[2], (*mark[3], state), hw)


def for_op(mark: Mark, depth: int) -> tuple[Mark, Any]:
    """The resume point of the stateful operator at ``depth`` from a restored ``mark``: the
    mark as the operators before it saw it, and its own state."""
    return (mark[0], mark[1], mark[2], mark[3][:depth], mark[4]), mark[3][depth]

"""shuffle: a lane's items permuted within consecutive windows of ``buffer_size``.

Each window's permutation is keyed by (seed, lane, where the window starts in the lane), so
it is a pure function of the stream. That is what makes it resumable without saving buffered
items or an RNG: an item's mark is *the mark just before its window* plus how many items of
the window were emitted through it; restoring replays the window from its start and skips.

A fast start: a lane's first window is emitted in parts of growing size (``warmup`` items,
then ``warmup`` more, then twice as many each time, the last part ending where the window
does), so the first items leave after ``warmup`` inputs rather than a whole window. Windows
stay aligned: the first ``size`` outputs are a permutation of the first ``size`` inputs. An
item of a part is marked ``{"skip": j + 1, "part": k}`` (a whole window's, ``j + 1``), so a
restore replays the very part.

A window's order is the permutation of its full capacity (``size``, or the part's) with the
positions it lacks left out (only the stream's last window can lack any). So the items a
restore will skip are known before the window is read again: :func:`replay_skips`. The lane
marks them (:data:`REPLAYED`) and the tokenize steps between it and the shuffle pass them by:
a restore tokenizes what it will deliver, not the part of the window already delivered.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.ops.block import Block
from zephon.ops.marks import Mark, op_states, position_of
from zephon.ops.operator import LaneContext, StreamOperator
from zephon.ops.windows import check_state, first_parts, parse_state, windowed
from zephon.permute import key_of, permute

__all__ = ["Shuffle", "replay_skips", "shuffle_blocks"]


def shuffle_blocks(
    blocks: AsyncIterator[Block],
    size: int,
    seed: int,
    lane: int,
    depth: int,
    resume: tuple[Mark, Any] | None,
    warmup: int = 0,
) -> AsyncIterator[Block]:
    """Windows of ``size`` items, each emitted in a keyed permutation (see module doc).

    ``depth``: stateful ops before this one (the length of incoming marks' op states).
    ``resume``: (the mark before the window to replay, its state: items of it emitted).
    ``warmup``: the first part of the lane's first window (0: no parts).
    """

    def permuted(
        before: Mark, items: list[Any], refs: list[Any], capacity: int, _: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        order = _order(seed, lane, before, capacity, len(items)).tolist()
        return [items[i] for i in order], [refs[i] for i in order]

    return windowed(blocks, size, lane, depth, resume, permuted, first_parts(size, warmup))


def _order(seed: int, lane: int, before: Mark, capacity: int, n: int) -> np.ndarray:
    """The window's order: its capacity's keyed permutation without the positions >= ``n``."""
    key = key_of("shuffle", seed, lane, repr(position_of(before)), op_states(before))
    order = permute(np.arange(capacity), capacity, key)
    return order if n == capacity else order[order < n]


def replay_skips(
    size: int, seed: int, warmup: int, lane: int, resume: tuple[Mark, Any]
) -> np.ndarray:
    """Positions (from the resumed window's start, ascending) of the items the restored
    shuffle will skip, whatever the window's length turns out to be: the first ``skip`` of
    the full window's order. (A shorter window skips the first ``skip`` of those that exist,
    which include every one of these that exists.)"""
    before, state = resume
    parts = first_parts(size, warmup)
    skip, part, _ = parse_state(state, parts)
    capacity = size if part is None else parts[part] - (parts[part - 1] if part else 0)
    if skip == 0:
        return np.zeros(0, dtype=np.int64)
    return np.sort(_order(seed, lane, before, capacity, capacity)[:skip])


@dataclass(frozen=True)
class Shuffle(StreamOperator):
    """``shuffle(buffer_size, seed, warmup)``: see the module doc."""

    name: ClassVar[str] = "shuffle"
    stateful: ClassVar[bool] = True

    size: int
    seed: int
    warmup: int = 0

    def label(self) -> str:
        parts = f", warmup={self.warmup}" if 0 < self.warmup < self.size else ""
        return f"shuffle(buffer_size={self.size}, seed={self.seed}{parts})"

    def check_state(self, state: Any) -> None:
        check_state(state, first_parts(self.size, self.warmup))

    def holds_items(self) -> bool:
        return self.warmup == 0  # with a warm-up, a lane's first items leave early

    def replay_skips(self, lane: int, resume: tuple[Mark, Any]) -> np.ndarray | None:
        skips = replay_skips(self.size, self.seed, self.warmup, lane, resume)
        return skips if len(skips) else None

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return shuffle_blocks(
            blocks, self.size, self.seed, lane.lane, lane.depth, lane.resume, self.warmup
        )

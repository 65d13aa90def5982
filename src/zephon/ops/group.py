"""batch(per_dataset=True): every batch from one dataset, per lane.

Each dataset's items go to its own open batch, which leaves when full; since the curriculum
mixes datasets in proportion, batches do too. Open batches hold items of several datasets at
once, so a batch's mark cannot be its last item's (as for ``batch``): it is the mark before
the oldest item still held in an open batch (``R``), with, per dataset, how many of its items
after ``R`` were already delivered in batches. Restoring replays the lane from ``R``, skips
those items and forms the same batches again. Nothing buffered is saved.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar

from zephon.ops.batch import Batch, collate
from zephon.ops.block import Block, dataset_of
from zephon.ops.marks import Mark, high_water, start_mark, with_state
from zephon.ops.operator import LaneContext, check_counts

__all__ = ["BatchPerDataset", "per_dataset_batches"]


class _Open:
    """One dataset's open batch: items, refs, the mark before its first item and the
    per-dataset counts just before it."""

    __slots__ = ("before", "counts", "items", "refs")

    def __init__(self, before: Mark, counts: dict[int, int]) -> None:
        self.items: list[Any] = []
        self.refs: list[Any] = []
        self.before = before
        self.counts = dict(counts)


async def per_dataset_batches(
    blocks: AsyncIterator[Block],
    size: int,
    drop_last: bool,
    lane: int,
    depth: int,
    resume: tuple[Mark, Any] | None,
) -> AsyncIterator[Block]:
    """Batches of ``size`` items of one dataset each (see the module doc). Long because the
    skip on resume, the open batches and the marks share one pass over the items."""
    prev, state = resume if resume is not None else (start_mark(lane, depth), 0)
    skip = {int(d): int(n) for d, n in state["skip"].items()} if isinstance(state, dict) else {}
    seen: dict[int, int] = {}  # items of each dataset since the replay began
    open_: dict[int, _Open] = {}  # by dataset, in the order their first items came

    def mark_after(last: Mark) -> Mark:
        if not open_:
            return with_state(last, 0, high_water(last))
        oldest = next(iter(open_.values()))
        held = {d: seen[d] - oldest.counts.get(d, 0) - len(o.items) for d, o in open_.items()}
        for d in seen:
            held.setdefault(d, seen[d] - oldest.counts.get(d, 0))
        skips = {str(d): n for d, n in sorted(held.items()) if n}
        return with_state(oldest.before, {"skip": skips}, high_water(last))

    async for block in blocks:
        out_items, out_refs, out_marks, nbytes = [], [], [], 0.0
        per_item = block.nbytes / max(1, len(block.items))
        for i, (item, ref) in enumerate(zip(block.items, block.refs, strict=True)):
            d = dataset_of(ref, "batch(per_dataset=True)")
            here = block.mark(i)
            if skip.get(d):
                skip[d] -= 1  # delivered before the checkpoint
            else:
                if d not in open_:
                    open_[d] = _Open(prev, seen)
                batch = open_[d]
                batch.items.append(item)
                batch.refs.append(ref)
            seen[d] = seen.get(d, 0) + 1
            prev = here
            if d in open_ and len(open_[d].items) == size:
                full = open_.pop(d)
                out_items.append(collate(full.items))
                out_refs.append(full.refs)
                out_marks.append(mark_after(here))
                nbytes += per_item * size
        if out_items:
            yield Block(lane, out_items, out_refs, out_marks, int(nbytes))
    while open_ and not drop_last:  # the end: partial batches, oldest first
        d = next(iter(open_))
        last = open_.pop(d)
        yield Block(lane, [collate(last.items)], [last.refs], [mark_after(prev)])


@dataclass(frozen=True)
class BatchPerDataset(Batch):
    """``batch(size, drop_last, per_dataset=True)``: see the module doc."""

    name: ClassVar[str] = "batch_per_dataset"
    stateful: ClassVar[bool] = True

    def label(self) -> str:
        return f"batch({self.size}, drop_last={self.drop_last}, per_dataset=True)"

    def check_state(self, state: Any) -> None:
        if state != 0 and not (isinstance(state, dict) and state.keys() == {"skip"}):
            raise ValueError('0 or {"skip": counts by dataset}')
        if state:
            check_counts(state["skip"], "skip")

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return per_dataset_batches(
            blocks, self.size, self.drop_last, lane.lane, lane.depth, lane.resume
        )

"""batch: a lane's samples grouped into batches, collated into columns."""

from __future__ import annotations

import numbers
from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np

from zephon.ops.block import Block

__all__ = ["batch_blocks", "collate"]


def _column(values: list[Any]) -> Any:
    first = values[0]
    if isinstance(first, bool | np.bool_) and all(isinstance(v, bool | np.bool_) for v in values):
        return np.array(values, dtype=bool)
    if isinstance(first, numbers.Number) and all(
        isinstance(v, numbers.Number) and not isinstance(v, bool) for v in values
    ):
        return np.asarray(values)
    if isinstance(first, np.ndarray) and all(
        isinstance(v, np.ndarray) and v.shape == first.shape and v.dtype == first.dtype
        for v in values
    ):
        return np.stack(values)
    return values


def collate(samples: Sequence[Any]) -> Any:
    """A list of samples as a dict of columns: numpy arrays for numeric fields of equal shape,
    lists otherwise. Non-dict samples collate as one column."""
    if samples and all(isinstance(s, dict) for s in samples):
        keys = list(samples[0])
        if all(list(s) == keys for s in samples):
            return {k: _column([s[k] for s in samples]) for k in keys}
        return {
            k: [s.get(k) for s in samples] for k in dict.fromkeys(k for s in samples for k in s)
        }
    return _column(list(samples))


async def batch_blocks(
    blocks: AsyncIterator[Block], size: int, drop_last: bool, lane: int
) -> AsyncIterator[Block]:
    """Batches of ``size`` samples, one output block per input block that completes any."""
    items: list[Any] = []
    refs: list[Any] = []
    mark: Any = None
    async for block in blocks:
        out_items, out_refs, out_marks = [], [], []
        for item, ref, m in zip(block.items, block.refs, block.marks, strict=True):
            items.append(item)
            refs.append(ref)
            mark = m
            if len(items) == size:
                out_items.append(collate(items))
                out_refs.append(refs)
                out_marks.append(mark)
                items, refs = [], []
        if out_items:
            yield Block(lane, out_items, out_refs, out_marks)
    if items and not drop_last:
        yield Block(lane, [collate(items)], [refs], [mark])

"""batch: a lane's samples grouped into batches, collated into columns."""

from __future__ import annotations

import numbers
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from zephon.arrays import stack
from zephon.errors import ConfigError
from zephon.ops.block import Block
from zephon.ops.operator import LaneContext, StreamOperator

__all__ = ["Batch", "batch_blocks", "collate"]


_NUMBERS = {int, float, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
            np.uint32, np.uint64, np.float16, np.float32, np.float64}  # fmt: skip


def _column(values: list[Any]) -> Any:
    types = set(map(type, values))  # one pass in C; the common cases need nothing more
    if types <= _NUMBERS:
        return np.asarray(values)
    if types <= {bool, np.bool_}:
        return np.array(values, dtype=bool)
    if types == {np.ndarray}:
        first = values[0]
        if all(v.shape == first.shape and v.dtype == first.dtype for v in values):
            return stack(values)
        if all(v.dtype == np.uint8 and v.ndim == 3 for v in values):
            shapes = sorted({v.shape for v in values})
            raise _UnequalImages(f"images of different sizes ({shapes[0]}, {shapes[-1]}...)")
        return values
    if all(isinstance(v, numbers.Number) and not isinstance(v, bool | np.bool_) for v in values):
        return np.asarray(values)  # other numeric types (Decimal, Fraction...)
    return values


class _UnequalImages(ValueError):
    pass


def collate(samples: Sequence[Any]) -> Any:
    """A list of samples as a dict of columns: numpy arrays for numeric fields of equal shape,
    lists otherwise. Non-dict samples collate as one column. Images (uint8 arrays of three
    dimensions) of different sizes raise ``ConfigError``: they cannot make one array."""
    if samples and set(map(type, samples)) == {dict}:
        keys = list(samples[0])
        if all(len(s) == len(keys) for s in samples):
            column = ""
            try:
                out = {}
                for column in keys:
                    out[column] = _column([s[column] for s in samples])
                return out
            except KeyError:
                pass  # same number of keys, different keys: the general case below
            except _UnequalImages as exc:
                raise ConfigError(
                    f"batch(): field {column!r} holds {exc}; resize or crop them to one size "
                    "first (resize((h, w)), center_crop, random_resized_crop)"
                ) from None
        return {
            k: [s.get(k) for s in samples] for k in dict.fromkeys(k for s in samples for k in s)
        }
    return _column(list(samples))


async def batch_blocks(
    blocks: AsyncIterator[Block], size: int, drop_last: bool, lane: int
) -> AsyncIterator[Block]:
    """Batches of ``size`` samples, one output block per input block that completes any. A
    batch's mark is its last sample's; a partial batch carries over to the next block."""
    held: list[Any] = []  # a partial batch
    held_refs: list[Any] = []
    mark: Any = None
    carried = 0.0  # bytes of the partial batch
    async for block in blocks:
        items, n = block.items, len(block.items)
        if not n:
            continue
        per_item = block.nbytes / n
        refs = block.refs
        out_items, out_refs, out_marks = [], [], []
        i, nbytes = 0, 0.0
        if held:
            i = min(size - len(held), n)
            held += items[:i]
            held_refs += refs[:i]
            carried += per_item * i
            mark = block.mark(i - 1)
            if len(held) == size:
                out_items.append(collate(held))
                out_refs.append(held_refs)
                out_marks.append(mark)
                held, held_refs, nbytes, carried = [], [], carried, 0.0
        while i + size <= n:
            out_items.append(collate(items[i : i + size]))
            out_refs.append(refs[i : i + size])
            out_marks.append(block.mark(i + size - 1))
            nbytes += per_item * size
            i += size
        if i < n:
            held, held_refs, mark = items[i:], refs[i:], block.mark(n - 1)
            carried = per_item * (n - i)
        if out_items:
            yield Block(lane, out_items, out_refs, out_marks, int(nbytes))
    if held and not drop_last:
        yield Block(lane, [collate(held)], [held_refs], [mark], int(carried))


@dataclass(frozen=True)
class Batch(StreamOperator):
    """``batch(size, drop_last)``: batches of ``size`` samples of a lane."""

    name: ClassVar[str] = "batch"
    batches: ClassVar[bool] = True
    changeable: ClassVar[tuple[str, ...]] = ("size", "drop_last")

    size: int
    drop_last: bool = False

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"batch size must be >= 1, got {self.size}")

    def label(self) -> str:
        return f"batch({self.size}, drop_last={self.drop_last})"

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return batch_blocks(blocks, self.size, self.drop_last, lane.lane)

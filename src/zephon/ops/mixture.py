"""ensure_mixture: a filtered lane stream brought back to the curriculum's weights.

Filters change the mixture: drop 40% of one dataset and its share falls. This step holds up
to ``buffer_size`` items in per-dataset queues and emits, after each input, every item the
mixture is owed: an item of dataset ``d`` leaves while ``d``'s emitted amount (samples, or
tokens of ``field``) is below its weight's share of everything emitted including it. When the
buffer is full, the surplus (items of the dataset furthest above its share) leaves anyway
(``on_surplus="emit"``: shares recover within the buffer's reach) or is dropped and counted
(``"drop"``: shares hold, for infinite curricula where a dataset's surplus comes round
again).

Exact on resume without saving buffered items: an output's mark is the mark before the
oldest item still queued (``R``), with, per dataset, how many of its items after ``R`` had
left (emitted or dropped), how many inputs after ``R`` the step had taken, and the amounts
emitted per dataset. Restoring replays those inputs from ``R``, skips the ones that had
left, queues the rest without emitting, then continues.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from zephon.choices import OnSurplus, WeightBy
from zephon.engine.stats import StageStats
from zephon.errors import ConfigError
from zephon.ops.block import Block, dataset_of
from zephon.ops.marks import Mark, high_water, start_mark, with_state
from zephon.ops.operator import LaneContext, StreamOperator, check_counts, is_count

__all__ = ["EnsureMixture", "ensure_mixture"]

_EPS = 1e-9


def check_arguments(weight_by: str, buffer_size: int, on_surplus: str) -> None:
    """``Pipeline.ensure_mixture``'s arguments, checked when the step is added (callers
    without a type checker pass any string)."""
    if weight_by not in get_args(WeightBy) or on_surplus not in get_args(OnSurplus):
        raise ConfigError(
            "ensure_mixture: weight_by is 'samples' or 'tokens', on_surplus "
            f"'emit' or 'drop'; got {weight_by!r}, {on_surplus!r}"
        )
    if buffer_size < 1:
        raise ConfigError(f"buffer_size must be >= 1, got {buffer_size}")


class _Queued:
    __slots__ = ("before", "counts", "fed", "item", "ref", "size")

    def __init__(
        self, item: Any, ref: Any, size: float, before: Mark, counts: dict[int, int], fed: int
    ) -> None:
        self.item, self.ref, self.size, self.before = item, ref, size, before
        self.counts, self.fed = counts, fed


async def ensure_mixture(
    blocks: AsyncIterator[Block],
    weights: Sequence[float],
    weight_by: WeightBy,
    field: str,
    buffer_size: int,
    on_surplus: OnSurplus,
    lane: int,
    depth: int,
    resume: tuple[Mark, Any] | None,
    stats: StageStats,
) -> AsyncIterator[Block]:
    """See the module doc. Long because replay, queues, the owed rule and the marks share
    one pass over the items."""
    total_w = float(sum(weights))
    share = [w / total_w for w in weights]
    prev, state = resume if resume is not None else (start_mark(lane, depth), 0)
    restored = state if isinstance(state, dict) else {}
    skip = {int(d): int(n) for d, n in restored.get("skip", {}).items()}
    replay = int(restored.get("fed", 0))  # inputs to queue again without emitting
    emitted = [float(x) for x in restored.get("emitted", [0.0] * len(share))]
    queues: list[deque[_Queued]] = [deque() for _ in share]
    seen: dict[int, int] = {}  # inputs of each dataset since R
    fed = 0  # inputs since R
    out: list[tuple[Any, Any, Mark]] = []

    def leave(d: int, keep: bool) -> None:
        q = queues[d].popleft()
        emitted[d] += q.size if keep else 0.0
        if keep:
            out.append((q.item, q.ref, mark_after()))
        else:
            stats.dropped += 1

    def mark_after() -> Mark:
        """The mark of an item leaving now: the step has taken every input up to ``prev``."""
        last = prev
        waiting = [q[0] for q in queues if q]
        data = {"emitted": list(emitted)}
        if not waiting:
            return with_state(last, {"fed": 0, **data}, high_water(last))
        oldest = min(waiting, key=lambda q: q.fed)
        left = {d: n - oldest.counts.get(d, 0) - len(queues[d]) for d, n in seen.items()}
        skips = {str(d): n for d, n in sorted(left.items()) if n}
        state = {"skip": skips, "fed": fed - oldest.fed, **data}
        return with_state(oldest.before, state, high_water(last))

    def owed() -> int | None:
        total = sum(emitted)
        best, gap = None, _EPS
        for d, q in enumerate(queues):
            if q and (missing := share[d] * (total + q[0].size) - emitted[d]) > gap:
                best, gap = d, missing
        return best

    def surplus() -> int:
        total = sum(emitted) or 1.0
        return max(
            (d for d, q in enumerate(queues) if q),
            key=lambda d: (emitted[d] / total - share[d], -d),
        )

    def drain(flush: bool) -> None:
        """Every owed item, then the surplus past the buffer (``flush``: everything). Each
        choice depends only on the queues and the amounts emitted, so a restore that
        rebuilds both continues with the same choices."""
        while True:
            d = owed()
            if d is not None:
                leave(d, True)
            elif any(queues) and (flush or sum(map(len, queues)) > buffer_size):
                leave(surplus(), flush or on_surplus == "emit")
            else:
                return

    async for block in blocks:
        per_item = block.nbytes / max(1, len(block.items))
        for i, (item, ref) in enumerate(zip(block.items, block.refs, strict=True)):
            d = dataset_of(ref, "ensure_mixture")
            here = block.mark(i)
            if skip.get(d):
                skip[d] -= 1  # it had left before the checkpoint
            else:
                size = 1.0 if weight_by == "samples" else float(len(item[field]))
                queues[d].append(_Queued(item, ref, size, prev, dict(seen), fed))
            seen[d] = seen.get(d, 0) + 1
            fed += 1
            prev = here
            if replay:  # queued again, as it was at the checkpoint
                replay -= 1
                if replay:
                    continue
            drain(False)
        if out:
            yield _block(lane, out, per_item)
    drain(True)  # the end: everything queued, in the owed order
    if out:
        yield _block(lane, out, 0.0)


def _block(lane: int, out: list[tuple[Any, Any, Mark]], per_item: float) -> Block:
    items, refs, marks = (list(x) for x in zip(*out, strict=True))
    out.clear()
    return Block(lane, items, refs, marks, int(per_item * len(items)))


@dataclass(frozen=True)
class EnsureMixture(StreamOperator):
    """``ensure_mixture(weight_by, buffer_size, on_surplus, field)`` toward ``weights`` (the
    curriculum's): see the module doc."""

    name: ClassVar[str] = "ensure_mixture"
    stateful: ClassVar[bool] = True

    weights: tuple[float, ...]
    weight_by: WeightBy = "samples"
    field: str = "input_ids"
    buffer_size: int = 1024
    on_surplus: OnSurplus = "emit"

    def __post_init__(self) -> None:
        check_arguments(self.weight_by, self.buffer_size, self.on_surplus)

    def label(self) -> str:
        return (
            f"ensure_mixture(weight_by={self.weight_by}, field={self.field!r}, "
            f"buffer_size={self.buffer_size}, on_surplus={self.on_surplus})"
        )

    def check_state(self, state: Any) -> None:
        if state == 0:
            return
        if not isinstance(state, dict) or set(state) - {"skip", "fed", "emitted"}:
            raise ValueError('0 or {"skip", "fed", "emitted"}')
        check_counts(state.get("skip", {}), "skip")
        if not is_count(state.get("fed", 0)):
            raise ValueError("fed: a count")
        emitted = state.get("emitted", [])
        if (
            not isinstance(emitted, list)
            or len(emitted) != len(self.weights)
            or not all(
                isinstance(x, int | float) and not isinstance(x, bool) and 0 <= x < float("inf")
                for x in emitted
            )
        ):
            raise ValueError(f"emitted: {len(self.weights)} amounts")

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return ensure_mixture(
            blocks,
            self.weights,
            self.weight_by,
            self.field,
            self.buffer_size,
            self.on_surplus,
            lane.lane,
            lane.depth,
            lane.resume,
            lane.stats,
        )

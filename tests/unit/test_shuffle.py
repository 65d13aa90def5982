"""The shuffle operator: windows, the parts of a lane's first window, and resuming from any
item's mark (the pipeline-level resume tests explore the rest)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.ops.block import Block
from zephon.ops.shuffle import replay_skips, shuffle_blocks
from zephon.ops.windows import first_parts


def _blocks(n: int, per: int) -> list[Block]:
    out = []
    for start in range(0, n, per):
        ids = list(range(start, min(n, start + per)))
        marks = [(0, None, i + 1, (), None) for i in ids]
        out.append(Block(0, ids, [(0, 0, i) for i in ids], marks))
    return out


async def _run(blocks: list[Block], size: int, warmup: int, resume: Any = None) -> list[Block]:
    async def source() -> AsyncIterator[Block]:
        for b in blocks:
            yield b

    return [b async for b in shuffle_blocks(source(), size, 7, 0, 0, resume, warmup)]


def test_first_parts_double_from_the_warmup_and_end_with_the_window() -> None:
    assert first_parts(1024, 64) == (64, 128, 256, 512, 1024)
    assert first_parts(1000, 64) == (64, 128, 256, 512, 1000)
    assert first_parts(100, 0) == () and first_parts(100, 100) == () and first_parts(5, 9) == ()


def test_the_first_items_leave_after_the_warmup_not_a_whole_window() -> None:
    """Blocks of one item: the output blocks' sizes are the parts, then whole windows."""
    out = asyncio.run(_run(_blocks(300, 1), size=100, warmup=10))
    assert [len(b.items) for b in out] == [10, 10, 20, 40, 20, 100, 100]
    items = [x for b in out for x in b.items]
    # Windows stay aligned: the first 100 outputs are the first 100 inputs, and each part
    # is a permutation of its own inputs.
    assert sorted(items[:100]) == list(range(100))
    assert sorted(items[:10]) == list(range(10)) and sorted(items[10:20]) == list(range(10, 20))
    assert sorted(items[100:200]) == list(range(100, 200))
    assert items[:100] != list(range(100))  # actually permuted


def test_without_warmup_the_first_window_leaves_whole() -> None:
    out = asyncio.run(_run(_blocks(250, 7), size=100, warmup=0))
    assert [len(b.items) for b in out] == [100, 100, 50]
    items = [x for b in out for x in b.items]
    assert sorted(items[:100]) == list(range(100))
    assert all(not isinstance(m[3][0], dict) for b in out for m in b.marks)


def test_a_windows_marks_are_computed_and_sliced_like_stored_ones() -> None:
    """No mark tuple is stored per item (each holds a chunk's cursor, so the garbage
    collector would track every one); computed marks equal the rule, sliced or not."""
    out = asyncio.run(_run(_blocks(250, 7), size=100, warmup=10))
    assert all(b._marks is None for b in out)
    first, whole = out[0], out[-2]  # a part of the first window; a whole window
    assert first.marks == [
        (0, None, 0, ({"skip": j + 1, "part": 0},), (None, 10)) for j in range(10)
    ]
    before = whole.marks[0][:3]
    assert whole.marks == [(*before, (j + 1,), (None, 200)) for j in range(100)]
    head, tail = whole.cut(30)
    assert head.marks == whole.marks[:30] and tail.marks == whole.marks[30:]
    assert tail.mark(0) == whole.mark(30) and tail.refs == whole.refs[30:]
    assert tail.progress(0, 5) == {0: (5, whole.mark(34))}


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 400),
    per=st.integers(1, 50),
    size=st.integers(1, 120),
    warmup=st.integers(0, 130),
    cut=st.floats(0, 1),
)
def test_resuming_from_any_items_mark_gives_the_rest(
    n: int, per: int, size: int, warmup: int, cut: float
) -> None:
    """Replaying from (the mark before the item's window or part, its state) skips exactly
    what was delivered, in the ramp and after it."""
    blocks = _blocks(n, per)
    whole = asyncio.run(_run(blocks, size, warmup))
    items = [x for b in whole for x in b.items]
    marks = [m for b in whole for m in b.marks]
    assert sorted(items) == list(range(n))
    k = min(n - 1, int(cut * n))
    lane, cursor, delivered, ops, _ = marks[k]
    before = (lane, cursor, delivered, ops[:-1], None)
    state = ops[-1]
    if isinstance(state, dict):
        assert 0 < warmup < size
    # The stream resumes at the mark before the window: feed the inputs after it.
    resumed = asyncio.run(_resume(_blocks(n, per), delivered, size, warmup, (before, state)))
    assert resumed == items[k + 1 :]


async def _resume(blocks: list[Block], after: int, size: int, warmup: int, at: Any) -> list[Any]:
    """The inputs after position ``after`` (what the lane replays from the mark)."""
    rest = []
    for b in blocks:
        keep = [m[2] > after for m in b.marks]
        if any(keep):
            rest.append(b.kept(keep, [x for x, k in zip(b.items, keep, strict=True) if k]))
    out = await _run(rest, size, warmup, at)
    return [x for b in out for x in b.items]


@pytest.mark.parametrize("bad", [-1])
def test_a_negative_warmup_is_refused(bad: int) -> None:
    from zephon import ConfigError, Dataset, Pipeline, StaticMixtureWorkSource

    ws = StaticMixtureWorkSource([Dataset.from_records("d", [{"id": 1}])])
    with pytest.raises(ConfigError, match="warmup"):
        Pipeline(ws, rank=0, world_size=1).shuffle(10, warmup=bad)


class _Gate:
    """A map that lets ``free`` items through, then holds every later one until the test
    opens it (and fails the run if that never happens)."""

    def __init__(self, free: int) -> None:
        import threading

        self.free = free
        self.seen = 0
        self.open = threading.Event()

    def __call__(self, x: dict[str, Any]) -> dict[str, Any]:
        self.seen += 1
        if self.seen > self.free and not self.open.wait(60):
            raise RuntimeError("the first item never left: the whole chunk was waited for")
        return x


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_lanes_first_item_does_not_wait_for_its_whole_first_chunk(shuffle: bool) -> None:
    """Chunks of 1,024 items: the first item leaves after the step's first piece (and the
    shuffle's first part), while the step still holds the rest of the chunk."""
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    records = [{"id": i} for i in range(3000)]
    ds = Dataset.from_records("d", records, samples_per_shard=3000)
    ws = StaticMixtureWorkSource([ds], seed=1, chunk_size=1024)
    gate = _Gate(free=200)
    pipe = Pipeline(ws, rank=0, world_size=1).map(gate)
    if shuffle:
        pipe = pipe.shuffle(1000)
    it = pipe.iter()
    try:
        first = next(it)
        assert gate.seen <= 201  # the rest of the first chunk is still held by the gate
        gate.open.set()
        rest = [first, *it]
    finally:
        gate.open.set()
        it.close()
    assert sorted(x["id"] for x in rest) == list(range(3000))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 130), cut=st.integers(0, 200), warmup=st.sampled_from([0, 8]))
def test_replay_skips_are_items_the_resumed_window_skips_whatever_its_length(
    n: int, cut: int, warmup: int
) -> None:
    """The positions computed before a window is read again are all skipped by it, also
    when the stream ends inside the window (its order leaves the missing positions out)."""
    blocks = _blocks(n, 5)
    out = asyncio.run(_run(blocks, size=50, warmup=warmup))
    marks = [m for b in out for m in b.marks]
    items = [x for b in out for x in b.items]
    k = cut % len(items)
    lane, cursor, window_start, (state,), hw = marks[k]  # an output's mark: its window's
    before = (lane, cursor, window_start, (), hw)  # start, and the outputs of it delivered
    skips = replay_skips(50, 7, warmup, 0, (before, state))
    # Every position the restore may stand in for is delivered already (or beyond the end).
    delivered = set(items[: k + 1])
    assert all(window_start + p >= n or window_start + p in delivered for p in skips)
    assert len(skips) == (state["skip"] if isinstance(state, dict) else state)
    resumed = asyncio.run(_run(_from(n, window_start), 50, warmup, (before, state)))
    assert [x for b in resumed for x in b.items] == items[k + 1 :]


def _from(n: int, start: int) -> list[Block]:
    ids = list(range(start, n))
    marks = [(0, None, i + 1, (), None) for i in ids]
    return [Block(0, ids, [(0, 0, i) for i in ids], marks)] if ids else []

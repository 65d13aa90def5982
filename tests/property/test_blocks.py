"""Property tests of merged-block provenance: what the consumer received of each lane is
computed from runs of lane blocks without a tuple per item, and must equal the per-item
answer."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.ops.block import Block, ChunkRows, Interleaved
from zephon.refs import Cursor


def lane_block(lane: int, n: int) -> Block:
    rows = ChunkRows(lane, Cursor(lane, 3, 0, (0,)), np.zeros(n, np.int64),
                     np.full(n, lane, np.int64), np.arange(n, dtype=np.int64) * 10 + lane,
                     np.arange(1, n + 1, dtype=np.int64))  # fmt: skip
    return Block(lane, list(range(n)), rows=rows)


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_interleaved_progress_equals_the_per_item_marks(data: st.DataObject) -> None:
    lanes = data.draw(st.integers(1, 4))
    blocks = [lane_block(lane, 40) for lane in range(lanes)]
    used = [0] * lanes
    rows = Interleaved()
    for _ in range(data.draw(st.integers(1, 6))):
        members = data.draw(st.lists(st.sampled_from(range(lanes)), min_size=1, unique=True))
        take = data.draw(st.integers(1, 5))
        if any(used[m] + take > 40 for m in members):
            break
        rows.add([(blocks[m], used[m]) for m in members], take)
        for m in members:
            used[m] += take
    lo = data.draw(st.integers(0, rows.size))
    hi = data.draw(st.integers(lo, rows.size))
    marks = rows.marks()
    expected: dict[int, tuple[int, object]] = {}
    for mark in marks[lo:hi]:
        expected[mark[0]] = (expected.get(mark[0], (0, None))[0] + 1, mark)
    assert rows.progress(lo, hi) == expected
    assert Block(-1, [None] * rows.size, rows=rows).progress(lo, hi) == expected
    # refs follow the same interleave as marks: item i of lane l is sample 10 i + l, mark i + 1
    assert [(r[1], r[2] // 10 + 1) for r in rows.refs()] == [(m[0], m[2]) for m in marks]

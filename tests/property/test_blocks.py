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
    rows = ChunkRows(
        lane,
        Cursor(lane, 3, 0, (0,)),
        np.zeros(n, np.int64),
        np.full(n, lane, np.int64),
        np.arange(n, dtype=np.int64) * 10 + lane,
        np.arange(1, n + 1, dtype=np.int64),
    )
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


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_the_assembler_emits_chunks_in_slot_order_whatever_its_byte_bound(
    data: st.DataObject,
) -> None:
    """Reads of a chunk (in the order of their first slot, each in slot order) come out in
    slot order with their provenance, whole or, under a byte bound, as prefixes."""
    from zephon.ops.decode import ChunkAssembler

    chunks = data.draw(st.lists(st.integers(1, 30), min_size=1, max_size=4))
    max_bytes = data.draw(st.sampled_from([1, 5, 40, 1 << 62]))
    emitted: list[tuple[list[int], ChunkRows]] = []
    assembler = ChunkAssembler(
        0, lambda items, rows, failed, nbytes: emitted.append((items, rows)), max_bytes
    )
    expected = []
    for c, n in enumerate(chunks):
        owner = data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        reads: dict[int, list[int]] = {}
        for slot, o in enumerate(owner):  # read o holds its slots in order
            reads.setdefault(o, []).append(slot)
        for o, slots in sorted(reads.items(), key=lambda kv: kv[1][0]):
            items = [c * 1000 + s for s in slots]
            assembler.add(
                Cursor(0, c, 0, (0,)),
                np.array(slots),
                items,
                o,
                c,
                np.array(items),
                nbytes=len(slots),
            )
        expected += [c * 1000 + s for s in range(n)]
    assembler.flush()
    assert [x for items, _ in emitted for x in items] == expected
    for items, rows in emitted:
        assert rows.sample.tolist() == items
        assert rows.delivered.tolist() == [x % 1000 + 1 for x in items]
        assert all(rows.cursor.chunk == x // 1000 for x in items)
    if max_bytes == 1 << 62:  # whole chunks, but the first leaves as it completes
        later = [rows.cursor.chunk for _, rows in emitted if rows.cursor.chunk > 0]
        assert later == list(range(1, len(chunks)))


def test_the_first_chunk_leaves_as_its_reads_fill_it_from_its_start() -> None:
    """A lane's first sample waits for the read holding the chunk's first slot only; the
    chunks after it leave whole."""
    from zephon.ops.decode import ChunkAssembler

    emitted: list[list[int]] = []
    assembler = ChunkAssembler(0, lambda items, rows, failed, nbytes: emitted.append(items))
    cursor = Cursor(0, 0, 0, (0,))

    def add(chunk: Cursor, slots: list[int]) -> None:
        assembler.add(chunk, np.array(slots), slots, 0, 0, np.array(slots), nbytes=len(slots))

    add(cursor, [5, 6, 7])  # a restore resumed the chunk at slot 5: that read is its start
    assert emitted == [[5, 6, 7]]
    add(cursor, [8, 10, 11])  # slot 9 still to come: 10 and 11 are held
    assert emitted == [[5, 6, 7], [8]]
    add(cursor, [9, 12])
    assert emitted == [[5, 6, 7], [8], [9, 10, 11, 12]]
    add(Cursor(0, 1, 0, (0,)), [0, 1])  # the next chunk: whole, when it ends
    add(Cursor(0, 1, 0, (0,)), [2])
    assembler.flush()
    assert emitted[3:] == [[0, 1, 2]]


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 50), st.integers(1, 12), st.integers(0, 10_000), st.booleans())
def test_split_pieces_rejoin_into_the_block(n: int, count: int, nbytes: int, rows: bool) -> None:
    block = lane_block(1, n)
    if not rows:  # a block with plain lists of refs and marks (after a filter, say)
        block = Block(1, block.items, block.refs, block.marks, 0)
    block.nbytes = nbytes
    block.extra["last_mark"] = ("after", n)
    pieces = block.split(count)
    assert 1 <= len(pieces) <= max(1, min(count, n))
    assert [x for p in pieces for x in p.items] == block.items
    assert [r for p in pieces for r in p.refs] == block.refs
    assert [m for p in pieces for m in p.marks] == block.marks
    assert sum(p.nbytes for p in pieces) == nbytes  # the budget's bytes, shared exactly
    assert [bool(p.extra) for p in pieces] == [False] * (len(pieces) - 1) + [True]  # the last

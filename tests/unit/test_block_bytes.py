"""Blocks carry the fetched bytes of their items through every step (``Block.nbytes``):
channels are bounded by them and a lane's slow start grows by them, so a step that dropped
them left the buffers after it bounded by counts only and the read-ahead stuck at its start."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops.block import Block
from zephon.ops.objects import FetchField, fetch_block
from zephon.ops.pack import Packing, pack_blocks
from zephon.ops.shuffle import shuffle_blocks
from zephon.ops.transform import run_apply
from zephon.storage import MemoryStore, open_storage

PER_ITEM = 1000


def _blocks(n: int, per: int, item: Any = None) -> list[Block]:
    out = []
    for start in range(0, n, per):
        ids = list(range(start, min(n, start + per)))
        items = [i if item is None else item(i) for i in ids]
        marks = [(0, None, i + 1, (), None) for i in ids]
        out.append(Block(0, items, [(0, 0, i) for i in ids], marks, PER_ITEM * len(ids)))
    return out


async def _source(blocks: list[Block]) -> AsyncIterator[Block]:
    for b in blocks:
        yield b


async def test_a_shuffle_window_weighs_what_its_items_weighed() -> None:
    for warmup in (0, 16):
        out = [
            b async for b in shuffle_blocks(_source(_blocks(1000, 64)), 128, 7, 0, 0, None, warmup)
        ]
        assert sum(len(b.items) for b in out) == 1000
        assert all(b.nbytes == PER_ITEM * len(b.items) for b in out)


async def test_packed_rows_and_an_applied_ops_outputs_weigh_their_inputs() -> None:
    def doc(i: int) -> dict[str, Any]:
        return {"input_ids": np.arange(1 + i % 50, dtype=np.int32)}

    blocks = _blocks(500, 50, doc)
    rows = [b async for b in pack_blocks(_source(blocks), Packing(64), 0, 0, None)]
    weighed = sum(b.nbytes for b in rows)
    # Each input block's bytes go with the rows cut from it; the last, partial row is free.
    assert PER_ITEM * 450 <= weighed <= PER_ITEM * 500

    async def twice(items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        async for x in items:
            yield x
            yield x

    out = [b async for b in run_apply(twice, _source(_blocks(300, 64)), 0)]
    assert sum(len(b.items) for b in out) == 600
    assert sum(b.nbytes for b in out) == 2 * PER_ITEM * 300  # two outputs per input each


def test_a_lane_on_workers_with_a_shuffle_still_grows_its_read_ahead() -> None:
    ds = Dataset.from_records(
        "r", [{"id": i, "text": "x" * 500} for i in range(4000)], samples_per_shard=500
    )
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    pipe = (
        Pipeline(ws, rank=0, world_size=1, lanes=1)
        .map(fns.as_text, processes=2)
        .shuffle(256)
        .batch(16)
    )
    assert sum(len(b["id"]) for b in pipe) == 4000
    run = pipe._last
    assert run is not None and run.res is not None
    (budget,) = run.res.budgets.values()
    start = pipe.spec.source.max_request_bytes
    # Grown by what the lane delivered: the batches after the shuffle weigh their documents.
    assert budget.capacity > start, (budget.capacity, start)


async def test_objects_read_into_samples_weigh_in_their_block() -> None:
    store = MemoryStore.default()
    for i in range(8):
        store.put(f"memory://weigh-objects/{i}.bin", b"z" * 5000)
    records = [{"id": i, "obj": f"memory://weigh-objects/{i}.bin"} for i in range(8)]
    ds = Dataset.from_records("objects", records, samples_per_shard=8)
    block = _blocks(8, 8, lambda i: records[i])[0]
    async with open_storage("memory://", {"store": store}) as storage:
        out = await fetch_block(
            FetchField("obj", "data", None, 1 << 20), block, [storage], [ds], 4, None
        )
    assert [x["data"] for x in out.items] == [b"z" * 5000] * 8
    assert out.nbytes == PER_ITEM * 8 + 5000 * 8  # the rows' bytes and the objects'

"""The planner's range requests over real datasets fetch and decode to exactly one pass."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.formatdata import write_compressed_jsonl, write_jsonl, write_parquet
from zephon.dataset import Dataset
from zephon.formats.blob import Blob
from zephon.plan import StaticMixtureWorkSource

pytestmark = pytest.mark.integration


async def fetch_lane(
    ws: StaticMixtureWorkSource, datasets: list[Dataset], lane: int, lanes: int
) -> list[Any]:
    out: list[Any] = []
    storages = [d.open_storage() for d in datasets]
    try:
        async for req in ws.requests(lane, lanes):
            ds = datasets[req.dataset]
            storage = storages[req.dataset]
            parts = await asyncio.gather(
                *(storage.read(req.uri, a, b, version=req.version) for a, b in req.ranges)
            )
            blob = Blob([(a, p) for (a, _), p in zip(req.ranges, parts, strict=True)])
            samples = ds.codec.decode(
                ds.shards[req.shard], ds.indexes[req.shard], blob, list(req.samples)
            )
            out.extend((req.dataset, json.dumps(s, sort_keys=True)) for s in samples)
    finally:
        for s in storages:
            await s.aclose()
    return out


@pytest.mark.parametrize("shuffle", ["none", "block", "global"])
async def test_one_pass_over_real_formats(tmp_path: Path, shuffle: str) -> None:
    web = write_jsonl(tmp_path / "web", shards=4)
    tab = write_parquet(tmp_path / "tab", shards=2)
    gz = write_compressed_jsonl(tmp_path / "gz")
    datasets = [
        await Dataset.afrom_path("web", str(tmp_path / "web")),
        await Dataset.afrom_path("tab", str(tmp_path / "tab")),
        await Dataset.afrom_path("gz", str(tmp_path / "gz")),
    ]
    ws = StaticMixtureWorkSource(datasets, shuffle=shuffle, chunk_size=50, stop_after_passes=1)
    got: Counter[tuple[int, str]] = Counter()
    for lane in range(2):
        got.update(await fetch_lane(ws, datasets, lane, 2))
    expected = Counter(
        (d, json.dumps(r, sort_keys=True)) for d, recs in enumerate([web, tab, gz]) for r in recs
    )
    # "repeat" for one pass: every sample of every dataset at least once, nothing foreign,
    # and repeats only where a lane's share of a dataset ran out before the others'.
    assert set(got) == set(expected)
    repeated = sum(got.values()) - len(expected)
    assert 0 <= repeated < 0.2 * len(expected)

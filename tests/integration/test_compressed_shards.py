"""Shards compressed as a whole (MDSWriter's every codec, LitData's zstd at every level):
discovered from the index file alone, read whole once, decompressed once per process, and
the same samples whether decoded in the loop or in worker processes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.formatdata import FIXTURES, reference, to_jsonable
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fixture", ["mds-zstd", "mds-br", "litdata-zstd", "litdata-zstd-chunk"])
@pytest.mark.parametrize("decode_processes", [0, 2])
def test_a_pipeline_over_compressed_shards_delivers_every_sample_once(
    fixture: str, decode_processes: int
) -> None:
    ds = Dataset.from_path(fixture, str(FIXTURES / fixture), index_cache=False)
    assert ds.discovery_stats.indexed == len(ds.shards)  # from index.json: no shard read
    pipe = Pipeline(
        StaticMixtureWorkSource([ds], seed=2, shuffle="global"),
        rank=0,
        world_size=1,
        lanes=2,
        decode_processes=decode_processes,
    )
    assert f"{len(ds.shards)} of {len(ds.shards)} shards are compressed" in pipe.explain()
    got = sorted(json.dumps(to_jsonable(s), sort_keys=True) for s in pipe)
    assert got == sorted(json.dumps(s, sort_keys=True) for s in reference(fixture))


@pytest.mark.parametrize("fixture", ["mds-gz", "litdata-zstd-sample"])
async def test_a_persistent_index_serves_compressed_shards(fixture: str, tmp_path: Path) -> None:
    root = tmp_path / fixture
    shutil.copytree(FIXTURES / fixture, root)
    first = await Dataset.afrom_path("c", str(root), index_cache=False)
    await first.awrite_index()
    again = await Dataset.afrom_path("c", str(root), index_cache=False)
    assert again.discovery_stats.from_persistent_index == len(again.shards)
    got = [json.dumps(to_jsonable(s), sort_keys=True) for s in again.head(again.num_samples)]
    assert got == [json.dumps(s, sort_keys=True) for s in reference(fixture)]


def test_decompressed_shards_are_kept_in_the_disk_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zephon.formats import compression

    calls = []
    zstd = compression.MDS_CODECS["zstd"]
    monkeypatch.setitem(
        compression.MDS_CODECS, "zstd", lambda data, limit: calls.append(1) or zstd(data, limit)
    )

    def epoch() -> list[str]:
        ds = Dataset.from_path("m", str(FIXTURES / "mds-zstd"), index_cache=False)  # new codec
        pipe = Pipeline(
            StaticMixtureWorkSource([ds], seed=1),
            rank=0,
            world_size=1,
            cache_dir=str(tmp_path / "cache"),
        )
        return [json.dumps(to_jsonable(s), sort_keys=True) for s in pipe]

    first = epoch()
    assert len(calls) == 4  # each shard decompressed once
    assert epoch() == first
    assert len(calls) == 4  # the next epoch's fresh codec found them on disk


@pytest.mark.parametrize("fixture", ["mds-snappy", "litdata-zstd", "vortex"])
def test_resume_is_exact_over_whole_read_and_self_read_shards(fixture: str) -> None:
    kind = "vortex" if fixture == "vortex" else None
    ds = Dataset.from_path(fixture, str(FIXTURES / fixture), format=kind, index_cache=False)

    def pipe() -> Pipeline:
        ws = StaticMixtureWorkSource([ds], seed=6, shuffle="global", stop_after_passes=2)
        return Pipeline(ws, rank=0, world_size=1, lanes=2).shuffle(16)

    def key(s: Any) -> str:
        return json.dumps(to_jsonable(s), sort_keys=True)

    full = [key(s) for s in pipe()]
    for cut in (1, len(full) // 2, len(full) - 1):
        first = pipe()
        it = iter(first)
        head = [key(next(it)) for _ in range(cut)]
        state = json.loads(json.dumps(first.checkpoint()))
        it.close()
        again = pipe()
        again.restore(state)
        assert head + [key(s) for s in again] == full, cut

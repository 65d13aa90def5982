"""Shards compressed as a whole (MDSWriter's every codec, LitData's zstd at every level):
discovered from the index file alone, read whole once, decompressed once per process, and
the same samples whether decoded in the loop or in worker processes."""

from __future__ import annotations

import json

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
    pipe = Pipeline(StaticMixtureWorkSource([ds], seed=2, shuffle="global"), rank=0,
                    world_size=1, lanes=2, decode_processes=decode_processes)  # fmt: skip
    assert f"{len(ds.shards)} of {len(ds.shards)} shards are compressed" in pipe.explain()
    got = sorted(json.dumps(to_jsonable(s), sort_keys=True) for s in pipe)
    assert got == sorted(json.dumps(s, sort_keys=True) for s in reference(fixture))

"""Vortex files, written by vortex-data itself: each file a shard, rows samples; every byte
Vortex reads comes through Zephon's storage layer (local disk and S3 here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_datasets import _upload
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.testing import S3Endpoint

vx = pytest.importorskip("vortex")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.integration

PER_FILE = 300


def write(root: Path, files: int = 3) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for f in range(files):
        ids = list(range(f * PER_FILE, (f + 1) * PER_FILE))
        part = {
            "id": ids,
            "text": [f"doc {i} " * (i % 5 + 1) for i in ids],
            "score": [i / 4 for i in ids],
        }
        vx.io.write(vx.array(pa.table(part)), str(root / f"part-{f}.vortex"))
        rows += [
            dict(zip(part, values, strict=True)) for values in zip(*part.values(), strict=True)
        ]
    return rows


@pytest.mark.parametrize("decode_processes", [0, 2])
def test_every_row_once_projected(tmp_path: Path, decode_processes: int) -> None:
    rows = write(tmp_path / "v")
    ds = Dataset.from_path("v", str(tmp_path / "v"), columns=["id", "text"])
    assert ds.format == "vortex" and ds.num_samples == 3 * PER_FILE
    pipe = Pipeline(
        StaticMixtureWorkSource([ds], seed=2, shuffle="global"),
        rank=0,
        world_size=1,
        lanes=2,
        decode_processes=decode_processes,
    )
    out = list(pipe)
    assert sorted(s["id"] for s in out) == [r["id"] for r in rows]
    by_id = {r["id"]: r for r in rows}
    assert all(s == {"id": s["id"], "text": by_id[s["id"]]["text"]} for s in out)


def test_a_missing_column_is_a_config_error(tmp_path: Path) -> None:
    write(tmp_path / "v", files=1)
    with pytest.raises(ConfigError, match="nope"):
        Dataset.from_path("v", str(tmp_path / "v"), columns=["nope"])


async def test_vortex_on_s3_with_a_persistent_index(
    s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    rows = write(tmp_path / "v")
    base = f"s3://{s3_bucket}/v/"
    options = s3_endpoint.storage_options()
    await _upload(base, options, tmp_path / "v")
    first = await Dataset.afrom_path("v", base, storage_options=options, index_cache=False)
    assert first.discovery_stats.indexed == 3  # one footer read per file
    await first.awrite_index()
    again = await Dataset.afrom_path("v", base, storage_options=options, index_cache=False)
    assert (again.discovery_stats.indexed, again.discovery_stats.from_persistent_index) == (0, 3)
    got = [
        s
        async for s in Pipeline(
            StaticMixtureWorkSource([again], shuffle="none"), rank=0, world_size=1
        )
    ]
    assert json.dumps(got, sort_keys=True) == json.dumps(rows, sort_keys=True)


@pytest.mark.parametrize("where", ["local", "s3"])
async def test_more_files_than_the_default_executor_has_threads(
    where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Discovery opens files on threads that wait for reads on the event loop, and the
    loop's reads need its default executor (local files, name lookups): opened on that
    executor, six files at once (its size on two cores) waited for each other forever."""
    rows = write(tmp_path / "v", files=16)
    base, options = str(tmp_path / "v") + "/", {}
    if where == "s3":
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        base = f"s3://{request.getfixturevalue('s3_bucket')}/many/"
        options = endpoint.storage_options()
        await _upload(base, options, tmp_path / "v")
    ds = await Dataset.afrom_path("v", base, storage_options=options, index_cache=False)
    assert ds.num_samples == len(rows) and ds.discovery_stats.indexed == 16

"""The shared local disk cache: a warm epoch reads almost nothing from storage, several
processes share one directory safely, a killed writer leaves nothing that is ever served,
and the limit holds."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_datasets import _upload
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.storage import DiskCache
from zephon.testing import S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]


def _shards(root: Path, shards: int = 4, per_shard: int = 300) -> list[int]:
    root.mkdir(parents=True, exist_ok=True)
    for s in range(shards):
        rows = (
            json.dumps({"id": s * per_shard + i, "text": f"doc {i} " * 20})
            for i in range(per_shard)
        )
        (root / f"part-{s}.jsonl").write_text("\n".join(rows) + "\n")
    return list(range(shards * per_shard))


@pytest.fixture
async def dataset(s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path) -> Dataset:
    _shards(tmp_path / "src")
    base = f"s3://{s3_bucket}/data/"
    await _upload(base, s3_endpoint.storage_options(), tmp_path / "src")
    return await Dataset.afrom_path("d", base, storage_options=s3_endpoint.storage_options())


def _epoch(ds: Dataset, seed: int, **kw: Any) -> tuple[list[int], dict[str, Any]]:
    ws = StaticMixtureWorkSource([ds], seed=seed, shuffle="global")
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, range_cache_bytes=0, **kw)
    ids = [s["id"] for s in pipe]
    return ids, pipe.stats()["fetch"]


def test_a_warm_epoch_reads_under_one_percent_from_storage(
    dataset: Dataset, tmp_path: Path
) -> None:
    cache = str(tmp_path / "cache")
    first, cold = _epoch(dataset, seed=1, cache_dir=cache)
    second, warm = _epoch(dataset, seed=2, cache_dir=cache)  # another order, other reads
    assert sorted(first) == sorted(second) == list(range(1200))
    assert cold["bytes"] > 0 and cold["disk_cache"]["written_bytes"] > 0
    assert warm["bytes"] <= 0.01 * cold["bytes"], (warm, cold)
    assert warm["disk_cache"]["hits"] > 0
    uncached, _ = _epoch(dataset, seed=2)
    assert second == uncached  # the cache changes where bytes come from, nothing else


def test_a_rewritten_object_is_never_served_from_the_cache(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 1 << 20)
    cache.put("s3://b/k", "v1", 0, b"0123456789", end=10)
    assert cache.get("s3://b/k", "v1", 2, 5) == b"234"
    assert cache.get("s3://b/k", "v1", 8, 50) == b"89"  # clipped at the known end
    assert cache.get("s3://b/k", "v2", 2, 5) is None  # another version: a miss


def test_ranges_side_by_side_serve_a_read_across_them(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 1 << 20)
    cache.put("u", "v", 0, b"abcd", end=None)
    cache.put("u", "v", 4, b"efgh", end=None)
    cache.put("u", "v", 10, b"kl", end=None)
    assert cache.get("u", "v", 2, 7) == b"cdefg"
    assert cache.get("u", "v", 6, 11) is None  # a gap at [8, 10)


def test_eviction_keeps_the_cache_within_its_limit(tmp_path: Path) -> None:
    cache = DiskCache(tmp_path / "c", 100_000)
    for i in range(60):
        cache.put(f"u{i}", "v", 0, bytes([i]) * 5_000, end=5_000)
    cache.evict()
    total = sum(p.stat().st_size for p in (tmp_path / "c").rglob("*") if p.is_file())
    assert total <= 100_000
    assert cache.get("u59", "v", 0, 5_000) == bytes([59]) * 5_000  # the newest stay
    assert cache.get("u0", "v", 0, 5_000) is None  # the oldest went first


SHARED = """
import hashlib, json, sys
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
ds = Dataset.from_path("d", sys.argv[1], storage_options=json.loads(sys.argv[2]))
ws = StaticMixtureWorkSource([ds], seed=int(sys.argv[4]), shuffle="global")
pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, range_cache_bytes=0, cache_dir=sys.argv[3],
                cache_limit_bytes=int(sys.argv[5]))
rows = sorted(json.dumps(s, sort_keys=True) for s in pipe)
print(len(rows), hashlib.sha256("\\n".join(rows).encode()).hexdigest())
"""


@pytest.mark.parametrize("limit", [1 << 30, 120_000])  # roomy, and evicting all the time
def test_four_processes_share_one_cache(
    dataset: Dataset, s3_endpoint: S3Endpoint, tmp_path: Path, limit: int
) -> None:
    cache = tmp_path / "shared"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [dataset.root, json.dumps(s3_endpoint.storage_options()), str(cache)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SHARED, *args, str(seed), str(limit)],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=ROOT,
        )
        for seed in range(4)
    ]
    outs = [p.communicate(timeout=100)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    rows = sorted(json.dumps(s, sort_keys=True) for s in dataset.head(dataset.num_samples))
    expected = [str(len(rows)), hashlib.sha256("\n".join(rows).encode()).hexdigest()]
    assert all(out == expected for out in outs)
    # every entry left holds exactly the object's bytes at its range
    reader = DiskCache(cache, 1 << 30)
    checked = 0
    for shard in dataset.shards:
        whole = _read(s3_endpoint, shard.uri)
        folder = reader._dir(shard.uri, shard.version)
        for entry in folder.glob("[0-9]*-[0-9]*") if folder.exists() else []:
            a, b = (int(x) for x in entry.name.split("-"))
            assert entry.read_bytes() == whole[a:b]
            checked += 1
    assert checked > 0


def _read(endpoint: S3Endpoint, uri: str) -> bytes:
    bucket, _, key = uri[len("s3://") :].partition("/")
    body: bytes = endpoint.client().get_object(Bucket=bucket, Key=key)["Body"].read()
    return body


WRITER = """
import sys
from zephon.storage import DiskCache
cache = DiskCache(sys.argv[1], 1 << 40)
print("writing", flush=True)
cache.put("s3://b/big", "v1", 0, b"x" * (384 << 20), end=None)  # killed before the end
"""


def test_a_writer_killed_mid_write_leaves_nothing_that_is_served(tmp_path: Path) -> None:
    root = tmp_path / "c"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(root)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    ) as child:
        assert child.stdout is not None and child.stdout.readline().strip() == "writing"
        folder = DiskCache(root, 1 << 40)._dir("s3://b/big", "v1")
        while not any(p.stat().st_size for p in folder.glob(".tmp-*")) if folder.exists() else 1:
            pass  # until the write is under way (a partial temporary file exists)
        child.send_signal(signal.SIGKILL)
    cache = DiskCache(root, 1 << 40)
    assert cache.get("s3://b/big", "v1", 0, 10) is None
    assert [p.name for p in folder.iterdir() if not p.name.startswith(".tmp-")] == []
    import zephon.storage.diskcache as module

    module._STALE_TMP_S = -1.0  # treat it as long dead: eviction removes it
    try:
        cache.evict()
    finally:
        module._STALE_TMP_S = 300.0
    assert list(folder.iterdir()) == []


async def test_a_dataset_opened_with_a_cache_reads_through_it(
    dataset: Dataset, s3_endpoint: S3Endpoint, tmp_path: Path
) -> None:
    cached = await Dataset.afrom_path(
        "d",
        dataset.root,
        cache_dir=tmp_path / "ds-cache",
        storage_options=s3_endpoint.storage_options(),
    )
    first, cold = _epoch(cached, seed=1)
    second, warm = _epoch(cached, seed=3)
    assert sorted(first) == sorted(second) == list(range(1200))
    assert cold["bytes"] > 0 and warm["bytes"] == 0

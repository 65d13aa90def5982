"""A dataset's persistent index read once for a process group: 3 real gloo processes against
the S3 server. Rank 0 makes the one GET and the others receive the bytes; with
``broadcast_index=False`` each rank reads it; a storage error on rank 0 is raised on every rank
with its class; a rank expecting another index than rank 0 sent says so."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import Throttled
from zephon.testing import S3Endpoint

pytestmark = pytest.mark.integration
WORLD = 3


def _process(rank: int, init: str, out: str, url: str, options: dict[str, Any]) -> None:
    import torch.distributed as dist

    from zephon.dataset.share import shared_read

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    got: dict[str, Any] = {}
    shared = Dataset.from_path("web", url, storage_options=options, index_cache=False)
    alone = Dataset.from_path(
        "web", url, storage_options=options, index_cache=False, broadcast_index=False
    )
    ws = StaticMixtureWorkSource([shared], seed=1, stop_after_passes=1)
    got["requests"] = [shared.discovery_stats.requests, alone.discovery_stats.requests]
    got["shards"] = [s.uri for s in shared.shards]
    plain = Dataset.from_path("plain", url + "more/", storage_options=options, index_cache=False)
    got["plain"] = [len(plain.shards), plain.discovery_stats.from_persistent_index]
    got["samples"] = sorted(s["id"] for s in Pipeline(ws, rank=rank, world_size=WORLD))

    async def throttled() -> bytes:
        raise Throttled("slow down", uri="s3://b/_zephon_index.json", status=503, code="SlowDown")

    try:  # rank 0's storage error, raised on every rank with its class and code
        asyncio.run(shared_read("s3://b/_zephon_index.json", throttled))
    except Throttled as exc:
        got["error"] = [type(exc).__name__, exc.code, str(exc)]

    async def mine() -> bytes:
        return b"{}"

    try:  # rank 0 sends one index, the others wait for another
        asyncio.run(shared_read("s3://b/one" if rank == 0 else "s3://b/two", mine))
        got["mismatch"] = "none"
    except Exception as exc:
        got["mismatch"] = f"{type(exc).__name__}: {exc}"
    gathered: list[Any] = [None] * WORLD
    dist.all_gather_object(gathered, got)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()  # no rank tears gloo down while another still works
    dist.destroy_process_group()


def test_one_rank_reads_the_index_for_the_process_group(
    tmp_path: Path, s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    import torch.multiprocessing as mp

    client = s3_endpoint.client()
    for s in range(4):
        body = "".join(json.dumps({"id": s * 10 + i}) + "\n" for i in range(10))
        client.put_object(Bucket=s3_bucket, Key=f"data/part-{s}.jsonl", Body=body.encode())
    url, options = f"s3://{s3_bucket}/data/", s3_endpoint.storage_options()
    ds = Dataset.from_path("web", url, storage_options=options, index_cache=False)
    asyncio.run(ds.awrite_index())
    client.put_object(Bucket=s3_bucket, Key="data/more/part-9.jsonl", Body=b'{"id": 99}\n')

    out = str(tmp_path / "got.json")
    args = (f"file://{tmp_path / 'init'}", out, url, options)
    mp.start_processes(_process, args=args, nprocs=WORLD, join=True, start_method="spawn")
    got = json.loads(Path(out).read_text())

    assert [g["requests"] for g in got] == [[1, 1], [0, 1], [0, 1]]
    assert all(g["shards"] == got[0]["shards"] for g in got) and len(got[0]["shards"]) == 4
    assert [g["plain"] for g in got] == [[1, 0]] * WORLD  # no index there: each rank lists
    assert sorted(i for g in got for i in g["samples"]) == list(range(40))
    assert got[0]["error"][:2] == ["Throttled", "SlowDown"]  # rank 0's own
    for g in got[1:]:
        assert g["error"][:2] == ["Throttled", "SlowDown"]
        assert "read by rank 0 for the process group" in g["error"][2]
    assert got[0]["mismatch"] == "none"
    for g in got[1:]:
        assert g["mismatch"].startswith("ConfigError: rank 0 broadcast the index s3://b/one")
        assert "same order on every rank" in g["mismatch"]

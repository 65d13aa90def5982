"""``zephon demo``: generate a dataset into an embedded local S3 server and stream it."""

from __future__ import annotations

import asyncio
import json
import random
import time

from tqdm import tqdm

from zephon.refs import ObjectInfo
from zephon.storage import StorageLimits, open_storage
from zephon.testing import MotoServer

_WORDS = [
    "the",
    "a",
    "of",
    "data",
    "loader",
    "stream",
    "shard",
    "token",
    "batch",
    "async",
    "range",
    "request",
    "object",
    "store",
]


def _jsonl_shard(rng: random.Random, target_bytes: int) -> bytes:
    lines, size, i = [], 0, 0
    while size < target_bytes:
        text = " ".join(rng.choices(_WORDS, k=rng.randrange(8, 120)))
        line = json.dumps({"id": i, "text": text}).encode() + b"\n"
        lines.append(line)
        size += len(line)
        i += 1
    return b"".join(lines)


async def _stream(options: dict[str, object], uris: list[str], concurrency: int) -> None:
    limits = StorageLimits(max_requests=concurrency, max_inflight_bytes=64 << 20)
    async with open_storage("s3://", options, limits=limits) as storage:
        infos = await asyncio.gather(*(storage.stat(u) for u in uris))
        ranges = [
            (info, start, min(start + (1 << 20), info.size_bytes))
            for info in infos
            for start in range(0, info.size_bytes, 1 << 20)
        ]
        total = sum(b - a for _, a, b in ranges)
        lines = 0
        started = time.perf_counter()
        with tqdm(total=total, unit="B", unit_scale=True, desc="streaming", ncols=90) as bar:

            async def one(info: ObjectInfo, start: int, stop: int) -> None:
                nonlocal lines
                data = await storage.read(info.uri, start, stop, version=info.version)
                lines += data.count(b"\n")
                bar.update(len(data))

            await asyncio.gather(*(one(*r) for r in ranges))
        elapsed = time.perf_counter() - started
        stats = storage.stats.as_dict()
    print(
        f"read {total / 1e6:.1f} MB ({lines} JSON lines) in {elapsed:.2f}s = "
        f"{total / 1e6 / elapsed:.1f} MB/s over {stats['requests']} range requests"
    )
    print(
        f"latency p50 {stats['p50_latency_s'] * 1e3:.1f} ms, p99 {stats['p99_latency_s'] * 1e3:.1f}"
        f" ms; retries {stats['retries']}, throttles {stats['throttles']}"
    )


def run_demo(*, shards: int, shard_mib: int, concurrency: int) -> int:
    """Start moto, write ``shards`` JSONL shards, stream them back by byte range."""
    print("starting an embedded S3 server (moto) on a free local port...")
    with MotoServer() as endpoint:
        endpoint.create_bucket("zephon-demo")
        client = endpoint.client()
        rng = random.Random(0)
        uris = []
        for i in tqdm(range(shards), desc="generating shards", ncols=90):
            key = f"web/shard-{i:05d}.jsonl"
            body = _jsonl_shard(rng, shard_mib << 20)
            client.put_object(Bucket="zephon-demo", Key=key, Body=body)
            uris.append(f"s3://zephon-demo/{key}")
        print(f"{shards} shards in s3://zephon-demo/web/ at {endpoint.endpoint_url}")
        asyncio.run(_stream(endpoint.storage_options(), uris, concurrency))
    return 0

"""A warm local disk cache against a cold one, side by side in one run.

JSONL shards on one moto server behind a latency proxy (``--latency-ms`` per request); each
epoch is one shuffled pass in a new order (another seed). Epoch 1 fills a fresh
``cache_dir``; epoch 2 reads through it; a third run reads epoch 2's order with no cache.
Printed: storage bytes and seconds per epoch, and the ratios the cache is judged by (warm
bytes / cold bytes <= 1%, cold time / warm time >= 1.5x).

    .venv/bin/python benchmarks/disk_cache.py
    .venv/bin/python benchmarks/disk_cache.py --shards 8 --docs 4000 --latency-ms 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.storage import open_storage
from zephon.testing import FaultProxy, Faults, MotoServer


def epoch(ds: Dataset, seed: int, cache_dir: str | None) -> tuple[float, dict[str, Any], int]:
    ws = StaticMixtureWorkSource([ds], seed=seed, shuffle="global")
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=4, cache_dir=cache_dir)
    start = time.perf_counter()
    n = sum(1 for _ in pipe)
    return time.perf_counter() - start, pipe.stats()["fetch"], n


async def upload(options: dict[str, Any], base: str, shards: int, docs: int) -> None:
    async with open_storage(base, options) as storage:
        for s in range(shards):
            rows = (
                json.dumps({"id": s * docs + i, "text": f"document {i} " * 100})
                for i in range(docs)
            )
            await storage.write(f"{base}part-{s:03d}.jsonl", ("\n".join(rows) + "\n").encode())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--latency-ms", type=float, default=30.0)
    args = parser.parse_args()
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as tmp:
        endpoint.create_bucket("bench")
        base = "s3://bench/cache/"
        asyncio.run(upload(endpoint.storage_options(), base, args.shards, args.docs))
        with FaultProxy(endpoint.endpoint_url, Faults(latency_s=args.latency_ms / 1000)) as proxy:
            ds = Dataset.from_path("d", base, storage_options=endpoint.storage_options(proxy.url))
            cache = str(Path(tmp) / "cache")
            cold_s, cold, n = epoch(ds, 1, cache)
            warm_s, warm, _ = epoch(ds, 2, cache)
            none_s, none, _ = epoch(ds, 2, None)
    mb = 2**20
    print(f"{n} samples per epoch, {args.shards} shards, +{args.latency_ms:.0f} ms per request")
    print(f"{'epoch':<26} {'seconds':>8} {'requests':>9} {'storage MB':>11}")
    for name, s, f in (
        ("1: cold cache", cold_s, cold),
        ("2: warm cache", warm_s, warm),
        ("2 again: no cache", none_s, none),
    ):
        print(f"{name:<26} {s:>8.2f} {f['requests']:>9} {f['bytes'] / mb:>11.2f}")
    print(f"warm bytes / cold bytes: {warm['bytes'] / max(1, cold['bytes']):.4f} (target <= 0.01)")
    print(
        f"cold time / warm time: {cold_s / warm_s:.2f}x (target >= 1.5x); "
        f"uncached / warm: {none_s / warm_s:.2f}x"
    )


if __name__ == "__main__":
    main()

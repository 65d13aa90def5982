"""Pipeline benchmarks, each measured side by side in one run.

1. End to end from the local S3 server (moto, its own process): Zephon vs a hand-written
   best-effort asyncio reader (aiobotocore, whole-shard GETs at the same concurrency, then
   ``json.loads`` per line / ``pyarrow`` per shard), JSONL and Parquet, one pass; both hand
   every sample to the same ``async for`` loop. Like for like twice: Zephon ``none`` against
   the reader, and Zephon's default ``block`` against the reader shuffling too (shard order,
   then every window of 1,024 samples). Every timed pass starts after ``gc.collect()``,
   so a full collection of garbage left by earlier passes (~0.1 s in this process, every few
   passes) lands on neither side at random.
2. Trivial-op overhead on in-memory data: samples/s through decode -> map(identity) -> out.
3. Peak RSS of a child process streaming a dataset larger than a 256 MiB fetch budget with
   a slow consumer.
4. Where small-row Parquet time goes: two chunk sizes, and decoding swapped for placeholders
   on both sides (``--breakdown`` runs this part alone).

    .venv/bin/python benchmarks/pipeline.py
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import io
import json
import random
import statistics
import string
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from functools import partial
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from peak_rss import peak_rss_mb
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import MotoServer, S3Endpoint

WORDS = "the quick brown fox jumps over a lazy dog while streaming shards".split()  # noqa: SIM905
# A 4,000-word vocabulary of pseudo-words, for document-sized samples that compress like text.
VOCAB = [
    "".join(random.Random(k).choices(string.ascii_lowercase, k=2 + k % 9)) for k in range(4000)
]


def text(sample: int, size: str) -> str:
    """Sample text: ``small`` is ~60-250 bytes; ``docs`` is ~0.3-3 KB of varied words."""
    if size == "small":
        return " ".join(WORDS[: 3 + (sample % 9)] * 4)
    rng = random.Random(sample)
    return " ".join(rng.choices(VOCAB, k=50 + sample % 450))


def jsonl_shard(shard: int, n: int, size: str = "small") -> bytes:
    return b"".join(
        json.dumps({"id": shard * n + i, "text": text(shard * n + i, size)}).encode() + b"\n"
        for i in range(n)
    )


def parquet_shard(shard: int, n: int, size: str = "small") -> bytes:
    table = pa.table(
        {
            "id": [shard * n + i for i in range(n)],
            "text": [text(shard * n + i, size) for i in range(n)],
        }
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=4096)
    return buf.getvalue()


WINDOW = 1024  # the shuffling reader's window, Zephon's chunk size

# One session for every pass, as any long-running reader keeps: it caches the parsed service
# models (a fresh session per pass spends ~0.2 s parsing JSON; Zephon shares them likewise).
_SESSION = get_session()


async def hand_written(
    endpoint: S3Endpoint, keys: list[str], fmt: str, concurrency: int, shuffle: bool = False
) -> int:
    """The best plain asyncio reader we could write for one pass of the same data: every shard
    fetched whole (one GET each, ``concurrency`` at a time, all started at once), parsed with
    the standard calls, and its samples handed to the consumer loop in shard order. With
    ``shuffle``, shards come in a random order and each window of 1,024 samples is permuted
    (the cheapest shuffle of comparable local strength to Zephon's ``block``)."""
    config = AioConfig(
        max_pool_connections=concurrency,
        s3={"addressing_style": "path"},
        retries={"total_max_attempts": 1, "mode": "standard"},
    )
    async with _SESSION.create_client(
        "s3",
        endpoint_url=endpoint.endpoint_url,
        aws_access_key_id=endpoint.key,
        aws_secret_access_key=endpoint.secret,
        region_name=endpoint.region_name,
        config=config,
    ) as client:
        sem = asyncio.Semaphore(concurrency)

        async def one(key: str) -> list[Any]:
            async with sem:
                resp = await client.get_object(Bucket="bench", Key=key)
                async with resp["Body"] as body:
                    data = await body.read()
            if fmt == "jsonl":
                rows = [json.loads(line) for line in data.splitlines() if line.strip()]
            else:
                rows = pq.read_table(pa.BufferReader(data)).to_pylist()
            if not shuffle:
                return rows
            out: list[Any] = []
            for at in range(0, len(rows), WINDOW):
                window = rows[at : at + WINDOW]
                out.extend(window[i] for i in rng.permutation(len(window)).tolist())
            return out

        rng = np.random.default_rng(0)
        order = rng.permutation(len(keys)).tolist() if shuffle else range(len(keys))

        async def samples() -> AsyncIterator[Any]:
            tasks = [asyncio.ensure_future(one(keys[k])) for k in order]
            try:
                for task in tasks:
                    for sample in await task:
                        yield sample
            finally:
                for task in tasks:
                    task.cancel()

        n = 0
        async for _ in samples():
            n += 1
        return n


async def with_zephon(
    ds: Dataset, concurrency: int, shuffle: str = "block", chunk_size: int = 1024
) -> int:
    ws = StaticMixtureWorkSource([ds], shuffle=shuffle, stop_after_passes=1, chunk_size=chunk_size)
    n = 0
    async for _ in Pipeline(ws, rank=0, world_size=1, max_inflight_requests=concurrency):
        n += 1
    return n


def end_to_end(shards: int, per_shard: int, rounds: int, concurrency: int, size: str) -> None:
    with MotoServer() as endpoint:
        endpoint.create_bucket("bench")
        client = endpoint.client()
        for i in range(shards):
            client.put_object(
                Bucket="bench", Key=f"jsonl/p{i:04d}.jsonl", Body=jsonl_shard(i, per_shard, size)
            )
            client.put_object(
                Bucket="bench", Key=f"pq/p{i:04d}.parquet", Body=parquet_shard(i, per_shard, size)
            )
        options = endpoint.storage_options()
        total = shards * per_shard
        print(
            f"# 1. end to end ({size} samples): {shards} shards x {per_shard} samples from "
            f"moto, concurrency {concurrency}, median of {rounds} alternating rounds after a "
            "warm-up"
        )
        print(
            f"{'format / zephon vs reader':<34} {'MB':>6} {'zephon samples/s':>17} "
            f"{'reader':>10} {'ratio':>7}"
        )
        for fmt, prefix in (("jsonl", "jsonl/"), ("parquet", "pq/")):
            ds = Dataset.from_path(fmt, f"s3://bench/{prefix}", storage_options=options)
            keys = [s.uri.split("/", 3)[3] for s in ds.shards]
            mb = sum(s.size_bytes for s in ds.shards) / 1e6
            cases: dict[str, Callable[[], Coroutine[Any, Any, int]]] = {
                "none": partial(with_zephon, ds, concurrency, "none"),
                "reader": partial(hand_written, endpoint, keys, fmt, concurrency),
                "block": partial(with_zephon, ds, concurrency, "block"),
                "shuffling reader": partial(hand_written, endpoint, keys, fmt, concurrency, True),
            }
            rates: dict[str, list[float]] = {name: [] for name in cases}
            for make in cases.values():  # warm-up, untimed: first imports and caches
                asyncio.run(make())
            names = list(cases)
            for r in range(rounds):  # each round in a rotated order: no side always first
                for name in names[r % 4 :] + names[: r % 4]:
                    gc.collect()
                    t = time.perf_counter()
                    n = asyncio.run(cases[name]())
                    assert n == total, (name, n, total)
                    rates[name].append(total / (time.perf_counter() - t))
            rate = {name: statistics.median(v) for name, v in rates.items()}
            for zephon, reader in (
                ("none", "reader"),
                ("block", "shuffling reader"),
                ("block", "reader"),
            ):
                label = f"{fmt}: {zephon} / {reader}"
                print(
                    f"{label:<34} {mb:>6.1f} {rate[zephon]:>17,.0f} {rate[reader]:>10,.0f} "
                    f"{rate[zephon] / rate[reader]:>6.2f}x"
                )


class _Placeholders:
    """Stands in for a decoded Parquet table: rows without building them."""

    def __init__(self, rows: int) -> None:
        self.rows = rows

    def to_pylist(self) -> list[None]:
        return [None] * self.rows


def breakdown(shards: int, per_shard: int, rounds: int, concurrency: int) -> None:
    """Where small-row Parquet time goes: Zephon at two chunk sizes against the reader, and
    both sides with Parquet decoding swapped for placeholders (what is left is everything
    else: requests, planning, assembly, delivery). CPU seconds of this process, best of
    ``rounds`` alternating rounds."""
    from zephon.formats.parquet import ParquetCodec

    real_decode, real_read_table = ParquetCodec.decode, pq.read_table

    def fake_decode(self: Any, shard: Any, index: Any, blob: Any, samples: Any) -> list[None]:
        return [None] * len(samples)

    with MotoServer() as endpoint:
        endpoint.create_bucket("bench")
        client = endpoint.client()
        for i in range(shards):
            client.put_object(
                Bucket="bench", Key=f"pq/p{i:04d}.parquet", Body=parquet_shard(i, per_shard)
            )
        ds = Dataset.from_path(
            "parquet", "s3://bench/pq/", storage_options=endpoint.storage_options()
        )
        keys = [sh.uri.split("/", 3)[3] for sh in ds.shards]

        def reader() -> Any:
            return hand_written(endpoint, keys, "parquet", concurrency)

        cases = {
            "zephon chunk 1024": lambda: with_zephon(ds, concurrency, "none"),
            "zephon chunk 4096": lambda: with_zephon(ds, concurrency, "none", 4096),
            "hand-written": reader,
            "zephon, no decoding": lambda: with_zephon(ds, concurrency, "none"),
            "hand-written, no decoding": reader,
        }
        best = dict.fromkeys(cases, float("inf"))
        for _ in range(rounds + 1):  # the first round warms up and is kept only if best
            for name, make in cases.items():
                fake = name.endswith("no decoding")
                ParquetCodec.decode = fake_decode if fake else real_decode  # type: ignore[method-assign]
                pq.read_table = (lambda src: _Placeholders(per_shard)) if fake else real_read_table
                try:
                    gc.collect()
                    started = time.process_time()
                    asyncio.run(make())
                    best[name] = min(best[name], time.process_time() - started)
                finally:
                    ParquetCodec.decode = real_decode  # type: ignore[method-assign]
                    pq.read_table = real_read_table
    print(
        f"\n# 4. small-row Parquet breakdown: {shards} x {per_shard} rows, shuffle none, "
        f"CPU seconds (best of {rounds})"
    )
    for name, cpu in best.items():
        print(f"{name:<28} {cpu:>7.3f} s")
    z, h = best["zephon chunk 1024"], best["hand-written"]
    zr, hr = best["zephon, no decoding"], best["hand-written, no decoding"]
    print(f"ratio at chunk 1024 {h / z:.2f}x, at chunk 4096 {h / best['zephon chunk 4096']:.2f}x")
    print(
        f"decoding: zephon {z - zr:.3f} s, reader {h - hr:.3f} s; "
        f"everything else: zephon {zr:.3f} s, reader {hr:.3f} s"
    )


def trivial_ops(n: int) -> None:
    records = [{"id": i, "text": "x" * (i % 50)} for i in range(n)]
    ds = Dataset.from_records("mem", records, samples_per_shard=10_000)
    ws = StaticMixtureWorkSource([ds], shuffle="block")

    async def run(lanes: int) -> float:
        t = time.perf_counter()
        count = 0
        async for _ in Pipeline(ws, rank=0, world_size=1, lanes=lanes).map(lambda s: s):
            count += 1
        assert count == n
        return n / (time.perf_counter() - t)

    print(f"\n# 2. trivial-op overhead, in-memory JSONL, {n:,} samples, decode + map(identity)")
    for lanes in (1, 4):
        rate = statistics.median([asyncio.run(run(lanes)) for _ in range(3)])
        print(f"{lanes} lane(s) on one rank, samples/s (median of 3): {rate:,.0f}")


def memory_child(endpoint_url: str, budget_mb: int) -> None:
    endpoint = S3Endpoint(endpoint_url)
    ds = Dataset.from_path("big", "s3://bench/big/", storage_options=endpoint.storage_options())

    async def run() -> int:
        pipe = Pipeline(
            StaticMixtureWorkSource([ds], shuffle="block"),
            rank=0,
            world_size=1,
            fetch_budget_bytes=budget_mb << 20,
        )
        n = 0
        async for _ in pipe:
            n += 1
            if n % 2000 == 0:
                await asyncio.sleep(0.001)  # a slow consumer: the pipeline must wait, not grow
        return n

    n = asyncio.run(run())
    rss = peak_rss_mb()
    size = sum(s.size_bytes for s in ds.shards) / 2**20
    print(json.dumps({"samples": n, "dataset_mb": size, "peak_rss_mb": rss}))


def memory(budget_mb: int, shards: int, shard_mb: int) -> None:
    with MotoServer() as endpoint:
        endpoint.create_bucket("bench")
        client = endpoint.client()
        line = json.dumps({"text": "y" * 1000}).encode() + b"\n"
        body = line * (shard_mb * 2**20 // len(line))
        for i in range(shards):
            client.put_object(Bucket="bench", Key=f"big/p{i:04d}.jsonl", Body=body)
        out = subprocess.run(
            [sys.executable, __file__, "--memory-child", endpoint.endpoint_url, str(budget_mb)],
            check=True,
            capture_output=True,
            text=True,
        )
        result: dict[str, Any] = json.loads(out.stdout)
    print(
        f"\n# 3. memory: {result['dataset_mb']:.0f} MiB dataset, fetch budget {budget_mb} MiB, "
        "slow consumer"
    )
    print(
        f"peak RSS {result['peak_rss_mb']:.0f} MiB (target < budget + 300 = {budget_mb + 300} MiB)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--per-shard", type=int, default=20_000, help="samples per shard, small")
    parser.add_argument("--docs-per-shard", type=int, default=4_000, help="samples per shard, docs")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--only-end-to-end", action="store_true", help="skip parts 2 to 4")
    parser.add_argument("--breakdown", action="store_true", help="run part 4 only")
    parser.add_argument("--memory-child", nargs=2, default=None)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child[0], int(args.memory_child[1]))
        return
    if args.breakdown:
        breakdown(args.shards, args.per_shard, args.rounds, args.concurrency)
        return
    end_to_end(args.shards, args.per_shard, args.rounds, args.concurrency, "small")
    print()
    end_to_end(args.shards, args.docs_per_shard, args.rounds, args.concurrency, "docs")
    if args.only_end_to_end:
        return
    trivial_ops(200_000)
    memory(256, shards=24, shard_mb=32)
    breakdown(args.shards, args.per_shard, args.rounds, args.concurrency)


if __name__ == "__main__":
    main()

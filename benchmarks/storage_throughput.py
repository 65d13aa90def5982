"""Zephon's read path vs a bare aiobotocore ranged-GET loop, side by side, in one run.

Both read the same byte ranges from the same local S3 server (moto, in its own process) at the
same concurrency; runs alternate so drift on a noisy machine hits both alike, and the median of
the rounds is reported: throughput, and the client's CPU per ranged GET (what a main-process
loader's event loop pays per request), for large ranges and for small ones. A second part
puts a fixed delay in front of the server (the fault proxy) and compares sequential with
concurrent reads: the ratio is how much latency concurrency hides.

    .venv/bin/python benchmarks/storage_throughput.py [--objects 16] [--object-mib 8]
        [--range-kib 1024 64]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session

from zephon.storage import StorageLimits, open_storage
from zephon.testing import FaultProxy, Faults, MotoServer, S3Endpoint

MiB = 1 << 20


def _ranges(objects: list[str], object_bytes: int, range_bytes: int) -> list[tuple[str, int, int]]:
    return [
        (uri, start, start + range_bytes)
        for start in range(0, object_bytes, range_bytes)
        for uri in objects
    ]


async def zephon_read(
    endpoint: S3Endpoint, url: str, ranges: list[tuple[str, int, int]], concurrency: int
) -> tuple[float, float]:
    limits = StorageLimits(max_requests=concurrency, min_requests=1, max_inflight_bytes=1 << 30)
    async with open_storage("s3://", endpoint.storage_options(url), limits=limits) as storage:
        await storage.stat(ranges[0][0])  # connect outside the timed region, as the bare loop

        async def one(uri: str, start: int, stop: int) -> int:
            return len(await storage.read(uri, start, stop))  # drop bytes at once, as bare does

        started, cpu = time.perf_counter(), time.process_time()
        total = sum(await asyncio.gather(*(one(*r) for r in ranges)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert total == sum(b - a for _, a, b in ranges)
    return elapsed, cpu


async def bare_read(
    endpoint: S3Endpoint, url: str, ranges: list[tuple[str, int, int]], concurrency: int
) -> tuple[float, float]:
    config = AioConfig(
        max_pool_connections=concurrency,
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
    )
    session = get_session()
    async with session.create_client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=endpoint.key,
        aws_secret_access_key=endpoint.secret,
        region_name=endpoint.region_name,
        config=config,
    ) as client:
        sem = asyncio.Semaphore(concurrency)
        bucket = ranges[0][0].split("/")[2]

        async def one(uri: str, start: int, stop: int) -> int:
            key = uri.split("/", 3)[3]
            async with sem:
                resp = await client.get_object(
                    Bucket=bucket, Key=key, Range=f"bytes={start}-{stop - 1}"
                )
                async with resp["Body"] as body:
                    return len(await body.read())

        await client.head_object(Bucket=bucket, Key=ranges[0][0].split("/", 3)[3])
        started, cpu = time.perf_counter(), time.process_time()
        total = sum(await asyncio.gather(*(one(*r) for r in ranges)))
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    assert total == sum(b - a for _, a, b in ranges)
    return elapsed, cpu


def _compare(
    endpoint: S3Endpoint,
    url: str,
    ranges: list[tuple[str, int, int]],
    conc: int,
    args: argparse.Namespace,
) -> None:
    total_mb = sum(b - a for _, a, b in ranges) / MiB
    kib = (ranges[0][2] - ranges[0][1]) // 1024
    print(
        f"# throughput: {len(ranges)} ranged GETs of {kib} KiB ({total_mb:.0f} MiB) "
        f"at concurrency {conc}, {args.rounds} rounds"
    )
    runs: dict[str, list[tuple[float, float]]] = {"zephon": [], "bare": []}
    asyncio.run(bare_read(endpoint, url, ranges, conc))  # warm the server up, not timed
    for i in range(args.rounds):  # alternate who goes first, so neither gains from order
        order = [("zephon", zephon_read), ("bare", bare_read)][:: 1 if i % 2 == 0 else -1]
        for name, read in order:
            runs[name].append(asyncio.run(read(endpoint, url, ranges, conc)))
    for name, label in (("zephon", "zephon read path"), ("bare", "bare aiobotocore")):
        wall = statistics.median(r[0] for r in runs[name])
        cpu_ms = statistics.median(r[1] for r in runs[name]) * 1000 / len(ranges)
        print(f"{label:<18} {total_mb / wall:8.1f} MB/s {cpu_ms:6.2f} ms CPU per GET")
    ratio = statistics.median(r[0] for r in runs["bare"]) / statistics.median(
        r[0] for r in runs["zephon"]
    )
    cpu = statistics.median(r[1] for r in runs["zephon"]) / statistics.median(
        r[1] for r in runs["bare"]
    )
    print(f"ratio zephon/bare  {ratio:8.2f}x throughput, {cpu:.2f}x the CPU\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--objects", type=int, default=16)
    parser.add_argument("--object-mib", type=int, default=8)
    parser.add_argument("--range-kib", type=int, nargs="*", default=[1024, 64])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--latency-ms", type=float, nargs="*", default=[20.0, 30.0, 50.0])
    args = parser.parse_args()

    with MotoServer() as endpoint:
        bucket = "bench"
        endpoint.create_bucket(bucket)
        client = endpoint.client()
        blob = bytes(range(256)) * (args.object_mib * MiB // 256)
        objects = []
        for i in range(args.objects):
            client.put_object(Bucket=bucket, Key=f"obj-{i:03d}", Body=blob)
            objects.append(f"s3://{bucket}/obj-{i:03d}")
        url, conc = endpoint.endpoint_url, args.concurrency
        for range_kib in args.range_kib:
            _compare(endpoint, url, _ranges(objects, len(blob), range_kib * 1024), conc, args)

        small = _ranges(objects[:4], 16 * 16 * 1024, 16 * 1024)  # 64 reads of 16 KiB
        print(f"# latency hiding: {len(small)} reads of 16 KiB through a delaying proxy")
        print(f"{'latency':>8} {'sequential s':>13} {'concurrent s':>13} {'speed-up':>9}")
        for latency_ms in args.latency_ms:
            with FaultProxy(endpoint.endpoint_url, Faults(latency_s=latency_ms / 1000)) as proxy:
                seq = asyncio.run(zephon_read(endpoint, proxy.url, small, 1))[0]
                conc = asyncio.run(zephon_read(endpoint, proxy.url, small, 32))[0]
            print(f"{latency_ms:>6.0f}ms {seq:>13.3f} {conc:>13.3f} {seq / conc:>8.1f}x")


if __name__ == "__main__":
    main()

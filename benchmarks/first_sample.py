"""Time to the first sample in a fresh process, and where it goes.

One moto server behind the latency proxy (+30 ms per request, in its own process) holds the
peers benchmark's 64,000 JSONL documents (16 shards) with a persistent index (or, with
``--index-cache``, without one: a listing, and shard indexes from the local index cache that a
first, unreported run fills). Each run is a fresh Python process that imports Zephon (timed
apart), then measures ``Dataset.from_path``, the first sample of a one-lane pipeline and the
whole epoch. ``floor``: a process that imports only numpy and aiobotocore and GETs the index
and a shard's first MiB (what any reader on this client needs before a first sample); ``bare``:
the same two GETs at presigned URLs, from a process that imports numpy and aiohttp alone (what
any asyncio reader needs, with no AWS SDK at all). With ``--trace`` the first run also prints
its timeline: storage client creation, each ranged GET, each decode. ``--torch`` imports torch
first, as a training process has; ``--freeze`` calls ``gc.freeze()`` after the imports (a
million long-lived objects no longer traversed by the garbage collector's full passes).

    .venv/bin/python benchmarks/first_sample.py [--runs 7] [--trace] [--index-cache]
        [--torch] [--freeze]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import boto3
from botocore.config import Config

from peers import BUCKET, upload, write_documents
from zephon import Dataset
from zephon.testing import MotoServer, ProxyProcess

CHILD = r"""
import functools, json, sys, time
began = time.perf_counter()
if "--torch" in sys.argv:
    import torch.utils.data  # a trainer's process: a million more long-lived objects
import zephon, zephon.storage.s3
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
imported = time.perf_counter() - began
if "--freeze" in sys.argv:
    import gc
    gc.freeze()  # what is alive after the imports is never traversed by the collector
events, done = [], False
if "--trace" in sys.argv:
    import zephon.formats.jsonl as jsonl, zephon.storage.s3 as s3
    def mark(name):
        if not done:
            events.append((round((time.perf_counter() - t0) * 1000, 1), name))
    def traced(cls, attr, name, is_async):
        orig = getattr(cls, attr)
        if is_async:
            async def wrapper(*a, **k):
                mark(name + " >"); out = await orig(*a, **k); mark(name + " <"); return out
        else:
            def wrapper(*a, **k):
                mark(name + " >"); out = orig(*a, **k); mark(name + " <"); return out
        setattr(cls, attr, functools.wraps(orig)(wrapper))
    traced(s3.S3Backend, "_create_client", "client", True)
    traced(s3.S3Backend, "get_range", "GET", True)
    traced(jsonl.JsonlCodec, "decode", "decode", False)
t0 = time.perf_counter()
ds = Dataset.from_path("web", sys.argv[1])
found = time.perf_counter() - t0
ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
it = iter(Pipeline(ws, rank=0, world_size=1, lanes=1))
next(it)
first = time.perf_counter() - t0
done = True
if events:
    events.append((round(first * 1000, 1), "first sample"))
n = 1 + sum(1 for _ in it)
print(json.dumps({"import": imported, "from_path": found, "first": first,
                  "epoch": time.perf_counter() - t0, "samples": n, "trace": events}))
"""


FLOOR = r"""
import asyncio, json, os, sys, time
began = time.perf_counter()
import numpy
from aiobotocore.session import get_session
imported = time.perf_counter() - began
bucket, _, key = sys.argv[1].removeprefix("s3://").partition("/")

async def first_bytes():
    async with get_session().create_client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"]) as c:
        for name in (key + "_zephon_index.json", key + "part-000.jsonl"):
            response = await c.get_object(Bucket=bucket, Key=name, Range="bytes=0-1048575")
            async with response["Body"] as body:
                await body.read()

t0 = time.perf_counter()
asyncio.run(first_bytes())
print(json.dumps({"import": imported, "first": time.perf_counter() - t0}))
"""

FLOOR_HTTP = r"""
import asyncio, json, sys, time
began = time.perf_counter()
import numpy
import aiohttp
imported = time.perf_counter() - began

async def first_bytes():
    async with aiohttp.ClientSession() as session:  # presigned by the parent: no SDK here
        for url in sys.argv[1:]:
            async with session.get(url, headers={"Range": "bytes=0-1048575"}) as response:
                assert response.status == 206, response.status
                await response.read()

t0 = time.perf_counter()
asyncio.run(first_bytes())
print(json.dumps({"import": imported, "first": time.perf_counter() - t0}))
"""


def _floor(script: str, args: list[str], env: dict[str, str], runs: int) -> tuple[float, float]:
    """Median import + first, and import alone, of ``runs`` fresh processes of ``script``."""
    out = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", script, *args],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            ).stdout.strip()
        )
        for _ in range(runs)
    ]
    return (
        statistics.median(r["import"] + r["first"] for r in out),
        statistics.median(r["import"] for r in out),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--trace", action="store_true")
    parser.add_argument(
        "--index-cache",
        action="store_true",
        help="no persistent index: a listing and the warm local index cache",
    )
    parser.add_argument("--torch", action="store_true", help="import torch first, as a trainer")
    parser.add_argument("--freeze", action="store_true", help="gc.freeze() after the imports")
    args = parser.parse_args()
    server = MotoServer()
    endpoint = server.start()
    proxy = ProxyProcess(endpoint.endpoint_url, 0.03)
    proxy.start()
    work = Path(tempfile.mkdtemp(prefix="zephon-first-"))
    try:
        client = endpoint.client()
        client.create_bucket(Bucket=BUCKET)
        write_documents(work / "docs")
        prefix = "jsonl" if args.index_cache else "jsonl-index"
        upload(client, work / "docs", prefix)
        options = {
            "endpoint_url": endpoint.endpoint_url,
            "key": endpoint.key,
            "secret": endpoint.secret,
        }
        if not args.index_cache:
            ds = Dataset.from_path(
                "web", f"s3://{BUCKET}/{prefix}/", storage_options=options, index_cache=False
            )
            asyncio.run(ds.awrite_index())
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": proxy.url,
            "AWS_ACCESS_KEY_ID": endpoint.key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
            "ZEPHON_CACHE_DIR": str(work / "cache"),
            "HOME": str(work),
        }
        runs = []
        for _ in range(args.runs + args.index_cache):  # with the cache: a first run fills it
            extra = ["--trace"] if args.trace and len(runs) == args.index_cache else []
            extra += ["--torch"] * args.torch + ["--freeze"] * args.freeze
            out = subprocess.run(
                [sys.executable, "-c", CHILD, f"s3://{BUCKET}/{prefix}/", *extra],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        runs = runs[args.index_cache :]
        url = f"s3://{BUCKET}/{prefix}/"
        floor, floor_import = _floor(FLOOR, [url], env, args.runs)
        signer = boto3.client(
            "s3",
            endpoint_url=proxy.url,
            aws_access_key_id=endpoint.key,
            aws_secret_access_key=endpoint.secret,
            region_name="us-east-1",
            config=Config(signature_version="s3v4"),
        )
        urls = [
            signer.generate_presigned_url(
                "get_object", Params={"Bucket": BUCKET, "Key": f"{prefix}/{name}"}, ExpiresIn=3600
            )
            for name in ("_zephon_index.json", "part-000.jsonl")
        ]
        bare, bare_import = _floor(FLOOR_HTTP, urls, env, args.runs)
        how = "warm local index cache" if args.index_cache else "persistent index"
        how += ", torch imported" * args.torch + ", gc.freeze()" * args.freeze
        print(
            f"# 64,000 JSONL documents (16 shards, {how}) at +30 ms; "
            f"{args.runs} fresh processes, medians"
        )
        for key in ("import", "from_path", "first", "epoch"):
            values = [r[key] for r in runs]
            print(
                f"{key:>10}: {statistics.median(values):.3f} s "
                f"(min {min(values):.3f}, max {max(values):.3f})"
            )
        total = statistics.median(r["import"] + r["first"] for r in runs)
        print(f"{'total':>10}: {total:.3f} s (import + first: a fresh process to its first sample)")
        print(
            f"{'floor':>10}: {floor:.3f} s (import numpy and aiobotocore, then GET the index "
            f"and a shard's first MiB: import {floor_import:.3f} s)"
        )
        print(
            f"{'bare':>10}: {bare:.3f} s (import numpy and aiohttp alone, the same two GETs "
            f"presigned: import {bare_import:.3f} s)"
        )
        print("first = from Dataset.from_path to the first sample; epoch includes it")
        if args.trace:
            print("# timeline of the first run (ms from Dataset.from_path):")
            for at, what in runs[0]["trace"]:
                print(f"{at:>8.1f}  {what}")
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()

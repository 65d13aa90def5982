"""Start-up at scale: N ranks (processes) starting at once against one S3 server (moto).

A dataset of ``--shards`` JSONL shards is written once, with a persistent index
(``zephon index``). For each N, N processes start together; each discovers the dataset
(no local index cache) and reads its first sample as rank r of N. Printed per N: discovery
requests per rank (with the persistent index, and without it: a listing plus a scan of each
shard, here with the local index cache warm so only the listing and stats remain), and the
median / max time from process start to the first sample.

    .venv/bin/python benchmarks/startup_scale.py [--ranks 1 8 32 64 --shards 400]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import statistics
import subprocess
import sys
import tempfile
import time

from zephon.testing import MotoServer

CHILD = """
import json, sys, time
started = time.perf_counter()
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
rank, world, index, cache = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
path = "s3://bench/web/" if index else "s3://bench/web-noindex/"
ds = Dataset.from_path("web", path, index_cache=cache if cache != "-" else False)
discovery = ds.discovery_stats
pipe = Pipeline(StaticMixtureWorkSource([ds], seed=0), rank=rank,
                world_size=world)
next(iter(pipe))
first = time.perf_counter() - started
fetch = pipe.stats()["fetch"]["requests"]
pipe.close()
print(json.dumps({"requests": discovery.requests, "listed": discovery.listed,
                  "first_s": first, "fetch": fetch}))
"""


def write(endpoint, shards: int) -> None:
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=endpoint.endpoint_url,
        aws_access_key_id=endpoint.key,
        aws_secret_access_key=endpoint.secret,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="bench")
    for s in range(shards):
        body = io.BytesIO()
        for i in range(100):
            body.write((json.dumps({"id": s * 100 + i, "text": "x" * 200}) + "\n").encode())
        for prefix in ("web", "web-noindex"):
            client.put_object(
                Bucket="bench", Key=f"{prefix}/part-{s:05d}.jsonl", Body=body.getvalue()
            )


def run(n: int, index: bool, env: dict[str, str], cache: str) -> list[dict[str, float]]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(r), str(n), "1" if index else "0", cache],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(n)
    ]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--shards", type=int, default=400)
    args = parser.parse_args()
    import os

    server = MotoServer()
    endpoint = server.start()
    try:
        write(endpoint, args.shards)
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint.endpoint_url,
            "AWS_ACCESS_KEY_ID": endpoint.key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        from zephon import Dataset

        os.environ.update(env)
        started = time.perf_counter()
        asyncio.run(Dataset.from_path("web", "s3://bench/web/", index_cache=False).awrite_index())
        print(
            f"# {args.shards} shards; persistent index written in "
            f"{time.perf_counter() - started:.1f} s"
        )
        with tempfile.TemporaryDirectory() as cache:
            Dataset.from_path("web", "s3://bench/web-noindex/", index_cache=cache)  # warm
            print(
                f"{'ranks':>5} {'index':>6} {'requests/rank':>14} {'listed':>7} "
                f"{'first sample median':>20} {'max':>7}"
            )
            for n in args.ranks:
                for index in (True, False):
                    rows = run(n, index, env, "-" if index else cache)
                    req = statistics.mean(r["requests"] for r in rows)
                    firsts = [r["first_s"] for r in rows]
                    print(
                        f"{n:>5} {'yes' if index else 'no':>6} {req:>14.1f} "
                        f"{rows[0]['listed']:>7} {statistics.median(firsts):>19.2f}s "
                        f"{max(firsts):>6.2f}s"
                    )
    finally:
        server.stop()


if __name__ == "__main__":
    main()

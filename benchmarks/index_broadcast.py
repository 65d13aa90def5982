"""A dataset's persistent index for N ranks of a gloo process group: read by each rank, or
read by rank 0 and broadcast (``Dataset.from_path(..., broadcast_index=True)``, the default
once ``torch.distributed`` is initialised).

One S3 server (moto) holds ``--shards`` JSONL shards with a persistent index. For each N,
N processes start together, join a gloo group (file rendezvous), wait at a barrier, then
discover the dataset (no local index cache) and take their first sample as rank r of N.
Printed per N and mode: index GETs of the whole job (discovery requests summed over the
ranks), the median / max time from the barrier to the first sample, and the time gloo takes
to broadcast a 1 MB and a 10 MB payload among the N processes (median over ranks of the
slowest rank's wait), from which the extrapolation to 1,000 ranks is drawn.

    .venv/bin/python benchmarks/index_broadcast.py [--ranks 8 32 64] [--shards 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from zephon.testing import MotoServer

CHILD = """
import json, sys, time
import torch, torch.distributed as dist
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
rank, world, init, broadcast = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] == "1"
dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
dist.barrier()
started = time.perf_counter()
ds = Dataset.from_path("web", "s3://bench/web/", index_cache=False, broadcast_index=broadcast)
pipe = Pipeline(StaticMixtureWorkSource([ds], seed=0), rank=rank, world_size=world)
next(iter(pipe))
first = time.perf_counter() - started
pipe.close()
payload = {}
for size in (1 << 20, 10 << 20):
    data = torch.zeros(size, dtype=torch.uint8)
    dist.barrier()
    t = time.perf_counter()
    dist.broadcast(data, src=0)
    dist.barrier()
    payload[size] = time.perf_counter() - t
print(json.dumps({"requests": ds.discovery_stats.requests, "first_s": first, "payload": payload}))
dist.destroy_process_group()
"""


def write(endpoint: Any, shards: int) -> None:
    client = endpoint.client()
    client.create_bucket(Bucket="bench")
    for s in range(shards):
        body = io.BytesIO()
        for i in range(100):
            body.write((json.dumps({"id": s * 100 + i, "text": "x" * 200}) + "\n").encode())
        client.put_object(Bucket="bench", Key=f"web/part-{s:05d}.jsonl", Body=body.getvalue())


def run(n: int, broadcast: bool, env: dict[str, str], work: Path) -> list[dict[str, Any]]:
    init = f"file://{tempfile.mktemp(dir=work, prefix='rendezvous-')}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, str(r), str(n), init, "1" if broadcast else "0"],
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )
        for r in range(n)
    ]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=900)
        if p.returncode != 0:
            raise SystemExit(f"a rank failed (exit {p.returncode})")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--shards", type=int, default=2000)
    args = parser.parse_args()
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as work:
        write(endpoint, args.shards)
        env = {
            **os.environ,
            "AWS_ENDPOINT_URL": endpoint.endpoint_url,
            "AWS_ACCESS_KEY_ID": endpoint.key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
        os.environ.update(env)
        from zephon import Dataset

        uri = asyncio.run(
            Dataset.from_path("web", "s3://bench/web/", index_cache=False).awrite_index()
        )
        size = endpoint.client().head_object(Bucket="bench", Key=uri.split("/bench/", 1)[1])
        print(
            f"# {args.shards} shards, persistent index {size['ContentLength'] / 1e3:.0f} KB; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(
            f"{'ranks':>5} {'mode':>10} {'index GETs':>10} {'first sample median':>20} "
            f"{'max':>7} {'bcast 1 MB':>10} {'bcast 10 MB':>11}"
        )
        for n in args.ranks:
            for broadcast in (False, True):
                rows = run(n, broadcast, env, Path(work))
                firsts = [r["first_s"] for r in rows]
                one = max(r["payload"][str(1 << 20)] for r in rows)
                ten = max(r["payload"][str(10 << 20)] for r in rows)
                print(
                    f"{n:>5} {'broadcast' if broadcast else 'each rank':>10} "
                    f"{sum(r['requests'] for r in rows):>10} "
                    f"{statistics.median(firsts):>19.2f}s {max(firsts):>6.2f}s "
                    f"{one:>9.3f}s {ten:>10.3f}s",
                    flush=True,
                )


if __name__ == "__main__":
    main()

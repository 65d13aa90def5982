"""``zephon demo``: a real pipeline over generated data in an embedded local S3 server.

Two datasets are written into moto (JSONL web text and Parquet code), mixed 70/30, shuffled,
mapped in a process pool, batched, and streamed with a progress bar; the pipeline's stats are
printed at the end.
"""

from __future__ import annotations

import io
import json
import random
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import MotoServer

_WORDS = [
    "the", "a", "of", "data", "loader", "stream", "shard", "token", "batch", "async", "range",
    "request", "object", "store", "model", "train", "gradient", "lane", "mixture", "curriculum",
]  # fmt: skip


def _jsonl_shard(rng: random.Random, target_bytes: int, first_id: int) -> bytes:
    lines, size, i = [], 0, first_id
    while size < target_bytes:
        text = " ".join(rng.choices(_WORDS, k=rng.randrange(8, 200)))
        line = json.dumps({"id": i, "text": text}).encode() + b"\n"
        lines.append(line)
        size += len(line)
        i += 1
    return b"".join(lines)


def _parquet_shard(rng: random.Random, rows: int, first_id: int) -> bytes:
    code = [
        f"def f{first_id + r}(x):\n    return x * {rng.randrange(100)}\n" * rng.randrange(1, 20)
        for r in range(rows)
    ]
    table = pa.table(
        {"id": list(range(first_id, first_id + rows)), "text": code, "language": ["python"] * rows}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=1024)
    return buf.getvalue()


def features(sample: dict[str, Any]) -> dict[str, Any]:
    """The demo's CPU step (runs in the worker pool): simple text statistics."""
    text = sample["text"]
    return {
        "id": sample["id"],
        "chars": len(text),
        "words": text.count(" ") + 1,
        "lines": text.count("\n") + 1,
    }


def run_demo(*, shards: int, shard_mib: int, concurrency: int) -> int:
    print("starting an embedded S3 server (moto) on a free local port...")
    with MotoServer() as endpoint:
        endpoint.create_bucket("zephon-demo")
        client = endpoint.client()
        rng = random.Random(0)
        for i in tqdm(range(shards), desc="writing web (jsonl)", ncols=90):
            body = _jsonl_shard(rng, shard_mib << 20, i * 1_000_000)
            client.put_object(Bucket="zephon-demo", Key=f"web/part-{i:05d}.jsonl", Body=body)
        for i in tqdm(range(max(1, shards // 2)), desc="writing code (parquet)", ncols=90):
            body = _parquet_shard(rng, 4096, i * 1_000_000)
            client.put_object(Bucket="zephon-demo", Key=f"code/part-{i:05d}.parquet", Body=body)
        options = endpoint.storage_options()
        started = time.perf_counter()
        web = Dataset.from_path("web", "s3://zephon-demo/web/", storage_options=options)
        code = Dataset.from_path("code", "s3://zephon-demo/code/", storage_options=options)
        print(f"discovered {web!r}\n           {code!r} in {time.perf_counter() - started:.2f}s")
        ws = StaticMixtureWorkSource(
            [web, code], {"web": 0.7, "code": 0.3}, seed=0, shuffle="block", stop_after_passes=1
        )
        pipe = (
            Pipeline(ws, rank=0, world_size=1, lanes=2, max_inflight_requests=concurrency)
            .map(features, processes=2)
            .batch(256)
            .prefetch(4)
        )
        print(pipe.explain())
        started = time.perf_counter()
        batches = samples = 0
        first_batch_s = None
        for batch in pipe.iter(progress=True):
            if first_batch_s is None:
                first_batch_s = time.perf_counter() - started
            batches += 1
            samples += len(batch["id"])
        elapsed = time.perf_counter() - started
        st = pipe.stats()
        fetch = st["fetch"]
    reused = fetch.get("scan_reused_bytes", 0)
    data = (fetch["bytes"] + reused) / 1e6
    print(
        f"{samples:,} samples in {batches:,} batches of 256 in {elapsed:.2f}s: "
        f"{samples / elapsed:,.0f} samples/s; first batch after {first_batch_s or 0:.2f}s"
    )
    print(
        f"data read: {data:,.1f} MB at {data / elapsed:,.1f} MB/s ({fetch['bytes'] / 1e6:,.1f} MB "
        f"fetched in {fetch['requests']} range requests, {reused / 1e6:,.1f} MB served from what "
        f"discovery's scan of the JSONL shards kept); fetch latency p50 "
        f"{1e3 * (fetch['p50_latency_s'] or 0):.1f} ms, p99 "
        f"{1e3 * (fetch['p99_latency_s'] or 0):.1f} ms, {fetch['retries']} retries; "
        f"consumer stalled {st['consumer_stall_s']:.2f}s"
    )
    for name, stage in st["stages"].items():
        print(
            f"  {name:<16} in {stage['items_in']:>7} out {stage['items_out']:>7} "
            f"busy {stage['busy_s']:6.2f}s waiting {stage['waiting_s']:6.2f}s"
        )
    return 0

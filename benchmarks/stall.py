"""Does a slower consumer ever wait? A trainer-shaped loop against one S3 server (moto) behind
a latency proxy (+30 ms per request).

The pipeline: 16 JSONL shards of ~1.6 KB documents, 4 lanes, tokenize (a BPE trained here),
shuffle(1024), pack(2048), batch(8). First the loader alone (batches/s, its capacity); then a
consumer that sleeps ``step`` ms per batch (5, 20, 100): the share of wall time it waits for
data after the first batch, the p99 and max wait, and the first batch's time. Last, the first
batch after ``restore()`` of a mid-run checkpoint against a fresh start.

``--light``: the same data without tokenizing or packing (``shuffle(1024).batch(16)``), a
loader many times faster than any of the consumers. ``--engine process``: the pipeline in a
child process (its garbage collections and its hold on the GIL stay there).

    .venv/bin/python benchmarks/stall.py [--batches 120] [--light] [--engine process]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import time
from typing import Any

from zephon.testing import MotoServer
from zephon.testing.faults import ProxyProcess

WORDS = ["data", "stream", "shard", "token", "batch", "range", "lane", "the", "of", "model"]


def setup(endpoint: Any) -> Any:
    import boto3
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    client = boto3.client(
        "s3",
        endpoint_url=endpoint.endpoint_url,
        aws_access_key_id=endpoint.key,
        aws_secret_access_key=endpoint.secret,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="stall")
    rng = random.Random(0)
    for s in range(16):
        body = io.StringIO()
        for i in range(4000):
            text = " ".join(rng.choices(WORDS, k=rng.randrange(150, 400)))
            body.write(json.dumps({"id": s * 4000 + i, "text": text}) + "\n")
        client.put_object(
            Bucket="stall", Key=f"web/part-{s:03d}.jsonl", Body=body.getvalue().encode()
        )
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        WORDS * 50, trainers.BpeTrainer(vocab_size=64, special_tokens=["[UNK]", "<s>", "</s>"])
    )
    return tok


def build(tok: Any, light: bool = False, engine: str = "thread") -> Any:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    ds = Dataset.from_path("web", "s3://stall/web/")
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=None)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=4, engine=engine)
    if light:
        return pipe.shuffle(1024).batch(16)
    return pipe.tokenize(tok).shuffle(1024).pack(2048).batch(8)


def consume(pipe: Any, batches: int, step_s: float) -> dict[str, float]:
    started = time.perf_counter()
    it = pipe.iter()
    waits = []
    first = half = 0.0
    for n in range(batches):
        t = time.perf_counter()
        next(it)
        wait = time.perf_counter() - t
        if n == 0:
            first = time.perf_counter() - started
        else:
            waits.append(wait)
        if n == batches // 2:
            half = time.perf_counter()
        if step_s:
            time.sleep(step_s)
    end = time.perf_counter()
    wall = end - started - first
    pipe.close()
    lanes = 4  # every lane's first batch in: the start-up is over
    steady = waits[lanes - 1 :]
    steady_wall = wall - sum(waits[: lanes - 1]) - step_s * (lanes - 1)
    late = sum(waits[batches // 2 :]) / (end - half)  # waits[i] is batch i + 1's
    waits.sort()
    return {
        "first": first,
        "share": sum(waits) / wall,
        "p99": waits[int(0.99 * len(waits))],
        "max": waits[-1],
        "rate": (batches - 1 - batches // 2) / (end - half),
        "total": end - started,
        "late": late,
        "steady": sum(steady) / max(steady_wall, 1e-9),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=120)
    parser.add_argument("--light", action="store_true", help="no tokenize/pack: a fast loader")
    parser.add_argument("--engine", choices=["thread", "process"], default="thread")
    args = parser.parse_args()
    server = MotoServer()
    endpoint = server.start()
    proxy = ProxyProcess(endpoint.endpoint_url, 0.03)
    proxy.start()
    try:
        tok = setup(endpoint)
        os.environ.update(
            {
                "AWS_ENDPOINT_URL": proxy.url,
                "AWS_ACCESS_KEY_ID": endpoint.key,
                "AWS_SECRET_ACCESS_KEY": endpoint.secret,
                "AWS_DEFAULT_REGION": "us-east-1",
            }
        )
        alone = consume(build(tok, args.light, args.engine), args.batches * 2, 0.0)
        print(
            f"# loader alone: {alone['rate']:.0f} batches/s over the second half; first batch "
            f"{alone['first']:.2f} s; {args.batches * 2} batches in {alone['total']:.2f} s"
        )
        print(
            f"{'step':>6} {'demand':>7} {'wait share':>11} {'p99 wait':>9} {'max wait':>9} "
            f"{'first batch':>12} {'after every lane started':>25} "
            f"{'second half':>12}  target (< 1% waiting if capacity >= 2x demand)"
        )
        for step_ms in (5, 20, 100):
            n = max(30, min(args.batches, int(12_000 / step_ms)))
            r = consume(build(tok, args.light, args.engine), n, step_ms / 1000)
            ratio = alone["rate"] * step_ms / 1000  # the loader's capacity over the demand
            verdict = ("met" if r["share"] < 0.01 else "NOT met") if ratio >= 2 else "n/a"
            print(
                f"{step_ms:>4}ms {1000 / step_ms:>5.0f}/s {r['share']:>10.1%} "
                f"{r['p99'] * 1000:>7.0f}ms {r['max'] * 1000:>7.0f}ms {r['first']:>11.2f}s "
                f"{r['steady']:>24.1%} {r['late']:>11.1%}  {verdict} (capacity {ratio:.1f}x)"
            )
        pipe = build(tok, args.light, args.engine)
        it = pipe.iter()
        for _ in range(40):
            next(it)
        state = pipe.checkpoint()
        pipe.close()
        fresh = consume(build(tok, args.light, args.engine), 2, 0.0)["first"]
        again = build(tok, args.light, args.engine)
        again.restore(state)
        restored = consume(again, 2, 0.0)["first"]
        print(
            f"first batch: fresh {fresh:.2f} s, after restore() {restored:.2f} s "
            f"({restored / fresh:.2f}x; target <= 2x)"
        )
    finally:
        proxy.stop()
        server.stop()


if __name__ == "__main__":
    main()

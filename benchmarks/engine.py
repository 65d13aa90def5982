"""The child-process engine against the in-thread engine, with a trainer that holds the GIL.

The trainer-shaped consumer spends ``--step-ms`` (20) per batch in pure Python (holding the
interpreter lock, as a Python-heavy training step does); the loader decodes JSONL documents
(``--source local``, the default, or ``s3``: moto, a third CPU-hungry process on this
2-core machine), runs a pure-Python ``map`` over each (word statistics), and batches 64 of
them. With ``engine="thread"`` both share one interpreter lock; with
``engine="process"`` the loader has its own. Printed: batches/s of the loader alone, and of
the consumer with each engine (after its first batch, and with start-up), median of
``--rounds`` alternating rounds.

    .venv/bin/python benchmarks/engine.py [--batches 150] [--step-ms 20] [--work 1]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from pipeline import jsonl_shard
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.testing import MotoServer


class WordStats:
    """About 0.2 ms of pure Python per document and round: the kind of work a user map
    does (``rounds`` times over, for a heavier loader)."""

    def __init__(self, rounds: int = 1) -> None:
        self.rounds = rounds
        self.__name__ = f"word_stats(x{rounds})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        for _ in range(self.rounds):
            counts: dict[str, int] = {}
            for word in sample["text"].split():
                counts[word] = counts.get(word, 0) + 1
            lengths = sorted(len(w) for w in counts)
        stats = [len(counts), sum(counts.values()), lengths[len(lengths) // 2]]
        return {"id": sample["id"], "words": np.array(stats, np.int64)}


def build(ds: Dataset, engine: str, work: int) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=None)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, engine=engine)
    return pipe.map(WordStats(work)).batch(64)


def hold_gil(seconds: float) -> None:
    end = time.perf_counter() + seconds
    x = 0
    while time.perf_counter() < end:
        x += 1


def consume(pipe: Pipeline, batches: int, step_s: float) -> tuple[float, float]:
    """(batches/s after the first batch, batches/s from the start)."""
    started = time.perf_counter()
    it = pipe.iter()
    next(it)
    first = time.perf_counter()
    for _ in range(batches):
        batch = next(it)
        assert len(batch["id"]) == 64
        hold_gil(step_s)
    end = time.perf_counter()
    pipe.close()
    it.close()
    return batches / (end - first), (batches + 1) / (end - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=150)
    parser.add_argument("--step-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--source", choices=["local", "s3"], default="local")
    parser.add_argument("--work", type=int, default=1, help="rounds of the map's work")
    args = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if args.source == "s3":
            endpoint = stack.enter_context(MotoServer())
            endpoint.create_bucket("engine")
            for s in range(8):
                endpoint.client().put_object(
                    Bucket="engine",
                    Key=f"docs/part-{s:03d}.jsonl",
                    Body=jsonl_shard(s, 4000, "docs"),
                )
            os.environ.update(
                {
                    "AWS_ENDPOINT_URL": endpoint.endpoint_url,
                    "AWS_ACCESS_KEY_ID": endpoint.key,
                    "AWS_SECRET_ACCESS_KEY": endpoint.secret,
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
            )
            ds = Dataset.from_path("docs", "s3://engine/docs/")
        else:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            for s in range(8):
                (root / f"part-{s:03d}.jsonl").write_bytes(jsonl_shard(s, 4000, "docs"))
            ds = Dataset.from_path("docs", str(root))
        alone = consume(build(ds, "thread", args.work), args.batches, 0.0)[0]
        rates: dict[str, list[tuple[float, float]]] = {"thread": [], "process": []}
        for r in range(args.rounds):
            for engine in ("thread", "process") if r % 2 == 0 else ("process", "thread"):
                rates[engine].append(
                    consume(build(ds, engine, args.work), args.batches, args.step_ms / 1000)
                )
    steady = {e: statistics.median(v[0] for v in runs) for e, runs in rates.items()}
    whole = {e: statistics.median(v[1] for v in runs) for e, runs in rates.items()}
    print(
        f"# loader alone (in-thread): {alone:.1f} batches/s of 64 documents "
        f"(map: {args.work} rounds of word statistics)"
    )
    print(
        f"# consumer holding the GIL {args.step_ms:.0f} ms per batch "
        f"(at most {1000 / args.step_ms:.0f} batches/s), median of {args.rounds}"
    )
    print(f"{'engine':<10} {'batches/s':>10} {'with start-up':>14}")
    for engine in ("thread", "process"):
        print(f"{engine:<10} {steady[engine]:>10.1f} {whole[engine]:>14.1f}")
    print(
        f"process / thread: {steady['process'] / steady['thread']:.2f}x "
        f"({whole['process'] / whole['thread']:.2f}x with start-up; target >= 1.5x)"
    )


if __name__ == "__main__":
    main()

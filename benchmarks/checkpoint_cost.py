"""What checkpoints cost: their size at 64 lanes, and restore() over 100,000 shards.

1. Size: a tokenize -> shuffle(1024, warmup) -> pack -> batch pipeline of 64 lanes over two
   datasets, checkpointed early (300 batches) and later (3,000): bytes of JSON, compact
   (``separators=(",", ":")``) and as ``json.dumps`` writes it by default. Target <= 4 KB.
2. Restore: a local JSONL dataset of 100,000 shards with a persistent index (``zephon
   index``); the time to build the pipeline (discovery from the index, the source, the
   pipeline), the time ``restore()`` takes, and the first batch after it against a fresh
   start's. Target: restore <= 1 s; printed as a ratio to building the pipeline.

    python benchmarks/checkpoint_cost.py [--shards 100000]

The dataset is written once under the temporary directory and reused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def sizes() -> None:
    web = Dataset.from_records(
        "web", [{"text": "word " * (i % 60 + 5)} for i in range(40_000)], samples_per_shard=200
    )
    code = Dataset.from_records(
        "code", [{"text": "x = 1\n" * (i % 20 + 2)} for i in range(20_000)], samples_per_shard=200
    )
    source = StaticMixtureWorkSource([web, code], seed=1, shuffle="global")
    pipe = Pipeline(source, rank=0, world_size=1, lanes=64)
    pipe = pipe.tokenize("bytes").shuffle(1024, warmup=64).pack(128).batch(8)
    it = iter(pipe)
    done = 0
    for at in (300, 3_000):
        for _ in range(at - done):
            next(it)
        done = at
        state = pipe.checkpoint()
        compact = len(json.dumps(state, separators=(",", ":")))
        spaced = len(json.dumps(state))
        print(
            f"64 lanes after {at:,} batches: {compact:,} bytes compact JSON, {spaced:,} as "
            f"json.dumps writes it (target <= 4,096)"
        )
    it.close()  # type: ignore[attr-defined]


def dataset(shards: int) -> tuple[Path, str]:
    """``shards`` JSONL shards of 2 samples each and their persistent index (made once)."""
    root = Path(tempfile.gettempdir()) / f"zephon-bench-{shards}-shards"
    index = str(root) + ".zindex"
    if not os.path.exists(index):
        root.mkdir(exist_ok=True)
        for s in range(shards):
            path = root / f"part-{s:06d}.jsonl"
            path.write_text(f'{{"id": {2 * s}}}\n{{"id": {2 * s + 1}}}\n')
        ds = Dataset.from_path("many", str(root), format="jsonl", index_cache=False)
        asyncio.run(ds.awrite_index(index))
    return root, index


def build(root: Path, index: str) -> Pipeline:
    ds = Dataset.from_path("many", str(root), format="jsonl", index=index, index_cache=False)
    source = StaticMixtureWorkSource([ds], seed=3, shuffle="global")
    return Pipeline(source, rank=0, world_size=1, lanes=8).shuffle(256, warmup=16).batch(16)


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def restores(shards: int) -> None:
    root, index = dataset(shards)
    builds, restores_, fresh, again = [], [], [], []
    state = None
    for _ in range(3):
        t, pipe = timed(lambda: build(root, index))
        builds.append(t)
        it = iter(pipe)
        t, _ = timed(lambda it=it: next(it))
        fresh.append(t)
        for _ in range(200):
            next(it)
        state = json.loads(json.dumps(pipe.checkpoint()))
        it.close()  # type: ignore[attr-defined]
        other = build(root, index)
        t, _ = timed(lambda other=other, state=state: other.restore(state))
        restores_.append(t)
        it = iter(other)
        t, _ = timed(lambda it=it: next(it))
        again.append(t)
        it.close()  # type: ignore[attr-defined]
    b, r = statistics.median(builds), statistics.median(restores_)
    f, a = statistics.median(fresh), statistics.median(again)
    print(
        f"{shards:,} shards, persistent index: build {b:.3f} s, restore() {r:.4f} s "
        f"(ratio {r / b:.3f} of a build; target <= 1 s), first batch fresh {f:.3f} s, "
        f"after restore {a:.3f} s ({a / f:.2f}x); medians of 3"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=100_000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    sizes()
    restores(args.shards)


if __name__ == "__main__":
    main()

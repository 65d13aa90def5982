"""Peak memory against the fetch budget, whatever the record size.

For each record size, JSONL shards of ``--total-mb`` are written locally and read in one
shuffled pass (``--shuffle``; ``--window``: a shuffle step, ``--batch``: a batch step, on
``--lanes`` lanes) with ``fetch_budget_bytes=--budget-mb`` by a slow consumer (it sleeps
``--pause-ms``, default 2, per MiB received, so the pipeline runs ahead and fills every
buffer). Each case
runs in a child process, which reports its RSS after discovery and its peak RSS while
iterating; the growth must stay within the budget plus a fixed allowance (300 MiB).

    .venv/bin/python benchmarks/memory.py
    .venv/bin/python benchmarks/memory.py --total-mb 400 --budget-mb 32 --record-kb 1 64 256 1024
    .venv/bin/python benchmarks/memory.py --total-mb 128 --budget-mb 8 --record-kb 256 \
        --lanes 2 --window 32 --batch 4 --pause-ms 20
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
ALLOWANCE_MB = 300

CHILD = """
import json, sys, time
sys.path.insert(0, {here!r})
from peak_rss import peak_rss_mb
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

def rss_mb():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0

ds = Dataset.from_path("big", {path!r})
ws = StaticMixtureWorkSource([ds], seed=1, shuffle={shuffle!r})
pipe = Pipeline(ws, rank=0, world_size=1, lanes={lanes}, fetch_budget_bytes={budget} << 20)
if {window}:
    pipe = pipe.shuffle({window}, warmup=0)
if {batch}:
    pipe = pipe.batch({batch})
before, received, count = rss_mb(), 0, 0
start = time.perf_counter()
for sample in pipe:
    texts = sample["text"] if {batch} else [sample["text"]]
    count += len(texts)
    received += sum(map(len, texts))
    if received >= 1 << 20:
        time.sleep({pause} * received / (1 << 20))
        received = 0
print(json.dumps({{"before": before, "peak": peak_rss_mb(), "samples": count,
                  "seconds": time.perf_counter() - start}}))
"""


def write_shards(root: Path, record_kb: int, total_mb: int, shards: int = 8) -> int:
    """JSONL shards of ``total_mb`` in records of about ``record_kb``; returns the count."""
    root.mkdir(parents=True, exist_ok=True)
    per_shard = max(1, total_mb * 1024 // record_kb // shards)
    body = "x" * (record_kb * 1024 - 40)
    for s in range(shards):
        with open(root / f"part-{s:03d}.jsonl", "w") as f:
            for i in range(per_shard):
                f.write(json.dumps({"id": s * per_shard + i, "text": body}) + "\n")
    return per_shard * shards


def run_case(
    path: Path, budget_mb: int, shuffle: str, args: argparse.Namespace
) -> dict[str, float]:
    script = CHILD.format(
        here=str(HERE),
        path=str(path),
        budget=budget_mb,
        shuffle=shuffle,
        window=args.window,
        batch=args.batch,
        lanes=args.lanes,
        pause=args.pause_ms / 1000,
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--total-mb", type=int, default=400)
    parser.add_argument("--budget-mb", type=int, default=32)
    parser.add_argument("--record-kb", type=int, nargs="+", default=[1, 64, 256, 1024])
    parser.add_argument("--shuffle", default="block", help="the work source's shuffle mode")
    parser.add_argument("--window", type=int, default=0, help="a shuffle(N) step too (0: none)")
    parser.add_argument("--pause-ms", type=float, default=2.0, help="consumer's sleep per MiB")
    parser.add_argument("--batch", type=int, default=0, help="a batch(N) step (0: none)")
    parser.add_argument("--lanes", type=int, default=None)
    args = parser.parse_args()
    step = f", shuffle({args.window})" if args.window else ""
    print(
        f"{args.total_mb} MiB of JSONL per case{step}, fetch budget {args.budget_mb} MiB, "
        f"bound: budget + {ALLOWANCE_MB} MiB of growth"
    )
    print(
        f"{'record':>8} {'samples':>8} {'s':>6} {'RSS before':>11} {'peak':>7} "
        f"{'growth':>7} {'growth - budget':>16}  within"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for kb in args.record_kb:
            path = Path(tmp) / f"r{kb}"
            t = time.perf_counter()
            write_shards(path, kb, args.total_mb)
            t = time.perf_counter() - t
            r = run_case(path, args.budget_mb, args.shuffle, args)
            growth = r["peak"] - r["before"]
            ok = growth <= args.budget_mb + ALLOWANCE_MB
            print(
                f"{kb:>6}KB {int(r['samples']):>8} {r['seconds']:>6.1f} "
                f"{r['before']:>9.0f}MB {r['peak']:>5.0f}MB {growth:>5.0f}MB "
                f"{growth - args.budget_mb:>14.0f}MB  {'yes' if ok else 'NO'}"
            )
            for f in path.iterdir():
                f.unlink()


if __name__ == "__main__":
    main()

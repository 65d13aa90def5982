"""Planner throughput and memory over a synthetic 100,000-shard x 10,000-sample dataset.

Each shuffle mode runs in its own child process (so peak RSS is that mode's own), planning
``--pointers`` sample pointers of lane 0 into coalesced range requests. Prints pointers/s,
requests per chunk and the child's peak RSS (which includes the interpreter and numpy).

    .venv/bin/python benchmarks/planner.py [--pointers 2000000]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

from peak_rss import peak_rss_mb


def child(mode: str, pointers: int, shards: int, samples: int, lanes: int, mix: bool) -> None:
    from zephon.plan import Manifest, StaticMixtureWorkSource

    datasets = [Manifest.uniform("web", shards, samples, sample_bytes=2048)]
    mixture = None
    if mix:
        datasets.append(Manifest.uniform("code", shards // 10, samples, sample_bytes=4096))
        mixture = {"web": 0.7, "code": 0.3}
    ws = StaticMixtureWorkSource(datasets, mixture, shuffle=mode, stop_after_passes=None)
    chunks = ws.chunks(0, lanes)
    next(chunks)  # first chunk: builds the pass's shard order (O(shards)), timed separately
    started = time.perf_counter()
    planned = reads = 0
    for chunk in chunks:  # planned: mixture, order, lanes, coalesced reads (columnar)
        planned += len(chunk)
        reads += len(chunk.reads)
        if planned >= pointers:
            break
    plan_s = time.perf_counter() - started
    started = time.perf_counter()
    made = 0
    for chunk in chunks:  # the same work, then materialised as RangeRequest objects
        made += len(chunk)
        _ = chunk.requests
        if made >= pointers:
            break
    objects_s = time.perf_counter() - started
    rss_mb = peak_rss_mb()
    print(
        json.dumps(
            {
                "pps": planned / plan_s,
                "objects_pps": made / objects_s,
                "req_per_chunk": reads * 1024 / planned,
                "rss_mb": rss_mb,
            }
        )
    )


def batching(shards: int, samples: int, lanes: int, pointers: int = 500_000) -> None:
    """Chunks planned one at a time against eight per numpy pass, alternating in one process
    (the plans are identical; only the cost differs)."""
    import zephon.plan.planner as planner
    from zephon.plan import Manifest, StaticMixtureWorkSource

    datasets = [Manifest.uniform("web", shards, samples, sample_bytes=2048)]
    print(f"\n# chunks planned at once: pointers/s over {pointers:,} pointers, best of 2")
    print(f"{'shuffle':<16} {'1 at once':>12} {'8 at once':>12} {'ratio':>7}")
    saved = planner.CHUNKS_AT_ONCE
    try:
        for mode in ("none", "block", "global"):
            rates: dict[int, float] = {1: 0.0, 8: 0.0}
            for count in (1, 8, 1, 8):
                planner.CHUNKS_AT_ONCE = count
                ws = StaticMixtureWorkSource(datasets, shuffle=mode, stop_after_passes=None)
                chunks = ws.chunks(0, lanes)
                next(chunks)
                started, planned = time.perf_counter(), 0
                for chunk in chunks:
                    planned += len(chunk)
                    if planned >= pointers:
                        break
                rates[count] = max(rates[count], planned / (time.perf_counter() - started))
            print(f"{mode:<16} {rates[1]:>12,.0f} {rates[8]:>12,.0f} {rates[8] / rates[1]:>6.2f}x")
    finally:
        planner.CHUNKS_AT_ONCE = saved


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pointers", type=int, default=2_000_000)
    parser.add_argument("--shards", type=int, default=100_000)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--lanes", type=int, default=8)
    parser.add_argument("--child", default=None)
    parser.add_argument("--mix", action="store_true")
    args = parser.parse_args()
    if args.child:
        child(args.child, args.pointers, args.shards, args.samples, args.lanes, args.mix)
        return
    print(
        f"# {args.shards:,} shards x {args.samples:,} samples "
        f"({args.shards * args.samples:,} samples), lane 0 of {args.lanes}, "
        f"{args.pointers:,} pointers, chunk 1024"
    )
    print(
        f"{'shuffle':<16} {'planned ptr/s':>14} {'as objects ptr/s':>17} {'reads/chunk':>12} "
        f"{'peak RSS MB':>12}"
    )
    for mode, mix in [
        ("none", False),
        ("shards", False),
        ("block", False),
        ("global", False),
        ("block", True),
        ("global", True),
    ]:
        cmd = [
            sys.executable,
            __file__,
            "--child",
            mode,
            "--pointers",
            str(args.pointers),
            "--shards",
            str(args.shards),
            "--samples",
            str(args.samples),
            "--lanes",
            str(args.lanes),
        ] + (["--mix"] if mix else [])
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        label = mode + (" 70/30 mix" if mix else "")
        print(
            f"{label:<16} {out['pps']:>14,.0f} {out['objects_pps']:>17,.0f} "
            f"{out['req_per_chunk']:>12.1f} {out['rss_mb']:>12.0f}"
        )
    batching(args.shards, args.samples, args.lanes)


if __name__ == "__main__":
    main()

"""``zephon bench PATH``: read a dataset for a while and say how fast, and what limits it."""

from __future__ import annotations

import sys
import time
from typing import Any

from zephon.choices import DatasetFormat, ShuffleMode
from zephon.dataset import Dataset
from zephon.errors import ZephonError

__all__ = ["run_bench"]


def run_bench(
    path: str,
    fmt: DatasetFormat | None,
    options: dict[str, Any],
    allow_pickle: bool,
    seconds: float,
    shuffle: ShuffleMode,
    processes: int,
    lanes: int,
) -> int:
    """Discover ``path``, stream it (repeating if it ends) for ``seconds`` and print samples/s,
    MB/s, the time to the first sample, fetch latency percentiles and the busiest stage."""
    from zephon import Pipeline, StaticMixtureWorkSource

    started = time.perf_counter()
    try:
        ds = Dataset.from_path(
            _name(path), path, format=fmt, storage_options=options, allow_pickle=allow_pickle
        )
        discovered = time.perf_counter() - started
        ws = StaticMixtureWorkSource([ds], seed=0, shuffle=shuffle, stop_after_passes=None)
        pipe = Pipeline(ws, rank=0, world_size=1, lanes=lanes, decode_processes=processes)
        first = None
        count = 0
        it = pipe.iter()
        for _ in it:
            count += 1
            now = time.perf_counter()
            if first is None:
                first = now - started
            if now - started - discovered >= seconds:
                break
        stats = pipe.stats()
        pipe.close()
    except ZephonError as exc:
        print(f"zephon bench: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started - discovered
    fetch = stats["fetch"]
    print(f"dataset      {path} ({ds.format}, {ds.num_samples:,} samples, {len(ds.shards)} shards)")
    print(f"discovery    {discovered:.2f} s; first sample after {first or 0.0:.2f} s")
    passes = count / max(1, ds.num_samples)
    again = f" (the dataset read {passes:.1f} times over: it repeats)" if passes > 1 else ""
    data = fetch["bytes"] + fetch.get("scan_reused_bytes", 0)
    print(
        f"throughput   {count:,} samples in {elapsed:.1f} s{again}: {count / elapsed:,.0f} "
        f"samples/s, data read at {data / elapsed / 1e6:,.1f} MB/s (discovery not counted)"
    )
    p50, p99 = fetch["p50_latency_s"], fetch["p99_latency_s"]
    if p50 is not None:
        print(
            f"fetch        {fetch['requests']:,} requests, latency p50 {p50 * 1000:.1f} ms, "
            f"p99 {p99 * 1000:.1f} ms, {fetch['retries']} retries"
        )
    busiest = max(stats["stages"].items(), key=lambda kv: _share(kv[1]), default=None)
    if busiest is not None:
        name, st = busiest
        print(
            f"busiest      {name}: busy {_share(st):.0%} of its time (the stage to speed up first)"
        )
    return 0


def _share(stage: dict[str, Any]) -> float:
    total = stage["busy_s"] + stage["waiting_s"]
    return float(stage["busy_s"] / total) if total else 0.0


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path

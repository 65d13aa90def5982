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
    plot: str | None = None,
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
        timeline = Timeline(pipe) if plot else None
        it = pipe.iter()
        for _ in it:
            count += 1
            now = time.perf_counter()
            if first is None:
                first = now - started
            if timeline is not None:
                timeline.sample(now, count)
            if now - started - discovered >= seconds:
                break
        stats = pipe.stats()
        pipe.close()
    except ZephonError as exc:
        print(f"zephon bench: {exc}", file=sys.stderr)
        return 1
    elapsed = time.perf_counter() - started - discovered
    _print_report(path, ds, stats, count, elapsed, discovered, first)
    if timeline is not None and plot:
        try:
            timeline.plot(plot, f"zephon bench {path}")
        except ZephonError as exc:
            print(f"zephon bench: {exc}", file=sys.stderr)
            return 1
        print(f"plot         {plot}")
    busiest = max(stats["stages"].items(), key=lambda kv: _share(kv[1]), default=None)
    if busiest is not None:
        name, st = busiest
        print(
            f"busiest      {name}: busy {_share(st):.0%} of its time (the stage to speed up first)"
        )
    return 0


def _print_report(
    path: str,
    ds: Dataset,
    stats: dict[str, Any],
    count: int,
    elapsed: float,
    discovered: float,
    first: float | None,
) -> None:
    """The dataset, discovery, throughput and fetch lines of a bench run."""
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


def _share(stage: dict[str, Any]) -> float:
    total = stage["busy_s"] + stage["waiting_s"]
    return float(stage["busy_s"] / total) if total else 0.0


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1] or path


class Timeline:
    """What a bench run did over time, sampled twice a second: samples/s, the share of time
    the consumer waited, and each stage's busy share (for ``--plot``)."""

    EVERY_S = 0.5

    def __init__(self, pipe: Any) -> None:
        self.pipe = pipe
        self.rows: list[tuple[float, int, dict[str, Any]]] = []
        self.last = 0.0

    def sample(self, now: float, count: int) -> None:
        if now - self.last >= self.EVERY_S:
            self.last = now
            self.rows.append((now, count, self.pipe.stats()))

    def plot(self, path: str, title: str) -> None:
        """Draw the timeline to a PNG (matplotlib, the ``plot`` extra)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            from zephon.errors import ConfigError

            raise ConfigError("--plot needs matplotlib: pip install 'zephon[plot]'") from None
        pairs = list(zip(self.rows, self.rows[1:], strict=False))
        t0 = self.rows[0][0] if self.rows else 0.0
        times = [b[0] - t0 for _, b in pairs]
        fig, (rate, wait, busy) = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
        rate.plot(times, [(b[1] - a[1]) / max(1e-9, b[0] - a[0]) for a, b in pairs])
        rate.set_ylabel("samples/s")
        rate.set_title(title)
        wait.plot(
            times,
            [_delta(a, b, "consumer_stall_s") / max(1e-9, b[0] - a[0]) for a, b in pairs],
        )
        wait.set_ylabel("consumer waiting")
        wait.set_ylim(0, 1.05)
        names = list(self.rows[-1][2].get("stages", {})) if self.rows else []
        for name in names:
            shares = [(_busy(b, name) - _busy(a, name)) / max(1e-9, b[0] - a[0]) for a, b in pairs]
            busy.plot(times, shares, label=name)
        busy.set_ylabel("stage busy share")
        busy.set_xlabel("seconds")
        if names:
            busy.legend(fontsize="small", ncol=2)
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)


def _delta(
    a: tuple[float, int, dict[str, Any]], b: tuple[float, int, dict[str, Any]], key: str
) -> float:
    return float(b[2].get(key, 0.0) - a[2].get(key, 0.0))


def _busy(row: tuple[float, int, dict[str, Any]], name: str) -> float:
    return float(row[2].get("stages", {}).get(name, {}).get("busy_s", 0.0))

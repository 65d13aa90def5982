"""Storage faults and recovery: a pipeline reading without end from one S3 server (moto) behind
a fault-injecting proxy (+30 ms per request), through three phases measured side by side.

1. **Fault-free**: samples per second, second by second (the baseline: the median second).
2. **Stalls and trickles**: 1 request in 500 accepted and never answered, 1 in 500 whose body
   trickles at 1 KB/s. Printed: throughput against the baseline, reads hedged and won, the
   longest wait for one batch (it would be the 120 s attempt timeout without hedging).
3. **A storm of 503 SlowDown** on every request for ``--storm-s`` seconds, then nothing: the
   pipeline must not fail or hang; printed: the recovery time, from the storm's end to the
   first two seconds in a row at >= 90% of the baseline.

    .venv/bin/python benchmarks/storm.py [--storm-s 30] [--phase-s 20]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import threading
import time
from typing import Any

from zephon.testing import FaultProxy, Faults, MotoServer


def setup(endpoint: Any) -> None:
    client = endpoint.client()
    client.create_bucket(Bucket="storm")
    rng = random.Random(0)
    for s in range(16):
        body = io.StringIO()
        for i in range(4000):
            text = " ".join(
                rng.choices(["data", "shard", "token", "lane"], k=rng.randrange(50, 400))
            )
            body.write(json.dumps({"id": s * 4000 + i, "text": text}) + "\n")
        client.put_object(
            Bucket="storm", Key=f"web/part-{s:03d}.jsonl", Body=body.getvalue().encode()
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--storm-s", type=float, default=30.0)
    parser.add_argument("--phase-s", type=float, default=20.0, help="fault-free and stall phases")
    parser.add_argument("--after-s", type=float, default=20.0, help="measured after the storm")
    args = parser.parse_args()

    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    with MotoServer() as endpoint:
        setup(endpoint)
        with FaultProxy(endpoint.endpoint_url, Faults(latency_s=0.03)) as proxy:
            options = endpoint.storage_options(proxy.url)
            ds = Dataset.from_path("web", "s3://storm/web/", storage_options=options)
            ws = StaticMixtureWorkSource([ds], seed=0, shuffle="block", stop_after_passes=None)
            pipe = Pipeline(ws, rank=0, world_size=1, lanes=4, range_cache_bytes=0).batch(64)
            phases = [
                ("fault-free", args.phase_s, Faults(latency_s=0.03)),
                (
                    "stalls+trickles",
                    args.phase_s,
                    Faults(latency_s=0.03, stall_rate=0.002, trickle_rate=0.002, seed=1),
                ),
                ("storm", args.storm_s, Faults(latency_s=0.03, throttle_rate=1.0)),
                ("after", args.after_s, Faults(latency_s=0.03)),
            ]
            ends, at = [], 0.0
            for name, length, _ in phases:
                at += length
                ends.append((name, at))
            it = iter(pipe)
            next(it)  # discovery and the first batch: not measured
            arrivals: list[float] = []
            fetch_at: dict[str, dict[str, Any]] = {}

            def switch() -> None:  # the faults change on the clock, not on batches
                start = time.monotonic()
                for name, _, faults in phases:
                    proxy.faults = faults
                    fetch_at[name] = pipe.stats()["fetch"]
                    time.sleep(max(0.0, start + dict(ends)[name] - time.monotonic()))
                fetch_at["end"] = pipe.stats()["fetch"]

            t0 = time.monotonic()
            clock = threading.Thread(target=switch, daemon=True)
            clock.start()
            while time.monotonic() < t0 + at:
                next(it)
                arrivals.append(time.monotonic() - t0)
            clock.join()
            seconds: dict[str, list[int]] = {}
            longest_wait: dict[str, float] = {}
            begin = 0.0
            for name, end in ends:
                inside = [a for a in arrivals if begin <= a < end]
                seconds[name] = [
                    64 * sum(1 for a in inside if begin + k <= a < begin + k + 1)
                    for k in range(int(end - begin))
                ]
                gaps = [b - a for a, b in zip([begin, *inside], [*inside, end], strict=True)]
                longest_wait[name] = max(gaps)
                begin = end
            names = [n for n, _, _ in phases]
            after_stalls = fetch_at[names[2]]
            hedged = after_stalls["hedges"] - fetch_at[names[1]]["hedges"]
            won = after_stalls["hedges_won"] - fetch_at[names[1]]["hedges_won"]
            injected = dict(proxy.injected)
            pipe.close()
    base = statistics.median(seconds["fault-free"][3:])
    stalls = statistics.median(seconds["stalls+trickles"])
    after = seconds["after"]
    recovery = next(
        (i for i in range(len(after) - 1) if after[i] >= 0.9 * base and after[i + 1] >= 0.9 * base),
        None,
    )
    load = os.getloadavg()[0]
    print(f"load {load:.1f}; samples/s per second, baseline median {base:,.0f}")
    print(
        f"stalls+trickles: median {stalls:,.0f} = {stalls / base:.2f}x baseline; "
        f"{injected.get('stall', 0)} stalls, {injected.get('trickle', 0)} trickles injected, "
        f"{hedged} reads hedged, {won} hedges won; longest wait for a batch "
        f"{longest_wait['stalls+trickles']:.2f} s (fault-free: "
        f"{longest_wait['fault-free']:.2f} s)"
    )
    print(
        f"storm of {args.storm_s:.0f} s: {injected.get('throttle', 0)} throttled requests, "
        f"samples in the storm {sum(seconds['storm']):,}"
    )
    print(f"after the storm, per second: {after}")
    print(
        "recovery to >= 90% of the baseline: "
        + (f"{recovery} s" if recovery is not None else f"not within {args.after_s:.0f} s")
    )


if __name__ == "__main__":
    main()

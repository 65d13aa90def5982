"""A CPU-heavy map in process, on the local pool and on Ray actors, side by side.

The map spends about ``--ms`` milliseconds of pure Python per sample. Each placement reads
the same in-memory dataset once (one lane, chunks of ``--chunk`` samples, so blocks of that
size); printed: samples/s, the ratio to in-process and to ``Local(2)``, and the CPU seconds
of the trainer's own process (the point of moving work off the node). The round trip of one
block through a Ray actor with a no-op function is measured alone: the shipping overhead.
A local Ray head with 2 CPUs is started unless ``--address`` names a cluster.

    .venv/bin/python benchmarks/executors.py [--samples 12000 --ms 2 --rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import time
from typing import Any

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.executors import Local, Ray


def busy_n(sample: dict[str, Any], loops: int) -> dict[str, Any]:
    """``loops`` steps of pure Python (the interpreter holds the GIL throughout)."""
    acc = 0
    for i in range(loops):
        acc = (acc + i * i) % 1_000_003
    return {**sample, "acc": acc}


class Busy:
    """``busy_n`` with its loop count fixed (picklable, so it travels to workers)."""

    def __init__(self, loops: int) -> None:
        self.loops = loops
        self.__name__ = "busy"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return busy_n(sample, self.loops)


def calibrate(ms: float) -> Busy:
    """A map of about ``ms`` milliseconds per sample on this machine."""
    started = time.perf_counter()
    busy_n({}, 200_000)
    per_loop = (time.perf_counter() - started) / 200_000
    return Busy(max(1, int(ms / 1000 / per_loop)))


def cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read(ds: Dataset, chunk: int, fn: Busy, place: dict[str, Any]) -> tuple[float, float, int]:
    ws = StaticMixtureWorkSource([ds], seed=1, chunk_size=chunk)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=1).map(fn, **place)
    cpu, started = cpu_s(), time.perf_counter()
    n = sum(1 for _ in pipe)
    return time.perf_counter() - started, cpu_s() - cpu, n


def noop(items: list[Any]) -> int:
    return len(items)


def round_trip_ms(executor: Ray, items: list[Any], calls: int = 40) -> tuple[float, float]:
    """(seconds from a new pool to its first result, ms per block round trip after)."""
    from zephon.engine.raypool import RayPool

    async def main() -> tuple[float, float]:
        pool = RayPool(executor)
        try:
            started = time.perf_counter()
            await pool.run("probe", noop, items)  # actors up
            up = time.perf_counter() - started
            started = time.perf_counter()
            for _ in range(calls):
                await pool.run("probe", noop, items)
            return up, (time.perf_counter() - started) / calls * 1000
        finally:
            pool.close()

    return asyncio.run(main())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=12_000)
    parser.add_argument("--ms", type=float, default=2.0)
    parser.add_argument("--chunk", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--address", default=None)
    args = parser.parse_args()
    fn = calibrate(args.ms)
    records = [{"id": i, "text": f"document {i} " * 20} for i in range(args.samples)]
    ds = Dataset.from_records("cpu", records, samples_per_shard=500)

    cluster = None
    address = args.address
    if address is None:
        from zephon.testing.ray import RayCluster

        cluster = RayCluster(cpus=2)
        address = cluster.start()
    try:
        placements = {
            "processes=0": {},
            "Local(2)": {"executor": Local(2)},
            "Ray(2)": {"executor": Ray(2, address=address)},
        }
        results: dict[str, list[tuple[float, float, int]]] = {name: [] for name in placements}
        read(ds, args.chunk, fn, placements["Ray(2)"])  # connect and warm up once
        for _ in range(args.rounds):  # interleaved rounds: the machine's noise hits all alike
            for name, place in placements.items():
                results[name].append(read(ds, args.chunk, fn, place))
        up, trip = round_trip_ms(Ray(2, address=address), records[: args.chunk])
    finally:
        if cluster is not None:
            import ray

            ray.shutdown()
            cluster.stop()

    print(
        f"# {args.samples:,} samples x ~{args.ms} ms of pure Python, blocks of {args.chunk}, "
        f"median of {args.rounds} rounds"
    )
    print(
        f"{'placement':<12} {'samples/s':>10} {'vs in-process':>14} {'vs Local(2)':>12} "
        f"{'trainer CPU s':>14}"
    )
    rate = {n: statistics.median(r[2] / r[0] for r in rs) for n, rs in results.items()}
    for name, rs in results.items():
        cpu = statistics.median(r[1] for r in rs)
        print(
            f"{name:<12} {rate[name]:>10,.0f} {rate[name] / rate['processes=0']:>13.2f}x "
            f"{rate[name] / rate['Local(2)']:>11.2f}x {cpu:>14.2f}"
        )
    print(
        f"Ray: round trip of one {args.chunk}-sample block (no-op function) {trip:.1f} ms; "
        f"a new pool's first result after {up:.2f} s (actor start-up, once per run)"
    )


if __name__ == "__main__":
    main()

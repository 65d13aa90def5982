"""Stacking a batch of images into new memory: numpy's own allocation (madvised for huge pages
from 4 MiB on) against ``zephon.arrays.stack`` (plain anonymous pages), side by side.

A batch of 256 crops of 224 x 224 x 3 (38.5 MB) is stacked ``--rounds`` times each way,
alternating, keeping the last few batches alive as a consumer would. Prints the median, 90th
percentile and maximum time of each, their ratio, and the kernel's huge-page settings (where
``defrag`` is ``madvise``, the kernel compacts memory on the first touch of a madvised region,
and some allocations stall for a tenth of a second or more).

    .venv/bin/python benchmarks/pages.py [--rounds 60] [--batch 256]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from zephon.arrays import stack


def _setting(name: str) -> str:
    path = Path("/sys/kernel/mm/transparent_hugepage") / name
    return path.read_text().strip() if path.exists() else "n/a"


def _timed(fn: Callable[[], np.ndarray], kept: deque[np.ndarray]) -> float:
    started = time.perf_counter()
    kept.append(fn())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--batch", type=int, default=256)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    crops = [rng.integers(0, 256, (224, 224, 3), dtype=np.uint8) for _ in range(args.batch)]
    kept: deque[np.ndarray] = deque(maxlen=6)  # a few batches alive, as in a pipeline
    times: dict[str, list[float]] = {"numpy (madvised)": [], "zephon.arrays.stack": []}
    for _ in range(args.rounds):
        times["numpy (madvised)"].append(_timed(lambda: np.stack(crops), kept))
        times["zephon.arrays.stack"].append(_timed(lambda: stack(crops), kept))
    mb = args.batch * 224 * 224 * 3 / 1e6
    print(f"# {args.rounds} stacks of {args.batch} crops ({mb:.1f} MB) each way; transparent "
          f"huge pages: enabled={_setting('enabled')!r} defrag={_setting('defrag')!r}")  # fmt: skip
    print(f"{'allocation':<22} {'median':>8} {'p90':>8} {'max':>8}")
    summary = {}
    for label, values in times.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        summary[label] = (statistics.median(ordered), p90, ordered[-1])
        print(f"{label:<22} " + " ".join(f"{v * 1000:>6.1f}ms" for v in summary[label]))
    (m0, p0, x0), (m1, p1, x1) = summary.values()
    print(f"plain pages / numpy: median {m1 / m0:.2f}x, p90 {p1 / p0:.2f}x, max {x1 / x0:.2f}x")


if __name__ == "__main__":
    main()

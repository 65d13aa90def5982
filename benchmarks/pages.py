"""Stacking a batch of images into new memory: numpy's own allocation (madvised for huge pages
from 4 MiB on), fresh plain anonymous pages, and ``zephon.arrays.stack`` (plain pages, those of
batches already gone used again), side by side.

A batch of 256 crops of 224 x 224 x 3 (38.5 MB) is stacked ``--rounds`` times each way,
alternating, keeping the last few batches alive as a consumer would. Prints the median, 90th
percentile and maximum time of each, the ratios to numpy, and the kernel's huge-page settings (where
``defrag`` is ``madvise``, the kernel compacts memory on the first touch of a madvised region,
and some allocations stall for a tenth of a second or more).

    .venv/bin/python benchmarks/pages.py [--rounds 60] [--batch 256]
"""

from __future__ import annotations

import argparse
import mmap
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


def _fresh_plain(crops: list[np.ndarray]) -> np.ndarray:
    """Into fresh plain pages (what ``zephon.arrays.stack`` did before it reused pages)."""
    pages = mmap.mmap(-1, len(crops) * crops[0].nbytes, flags=mmap.MAP_PRIVATE)
    out = np.frombuffer(pages, np.uint8)
    out = out.reshape(len(crops), *crops[0].shape)
    np.stack(crops, out=out)
    return out


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
    ways: dict[str, Callable[[], np.ndarray]] = {
        "numpy (madvised)": lambda: np.stack(crops),
        "fresh plain pages": lambda: _fresh_plain(crops),
        "zephon.arrays.stack": lambda: stack(crops),
    }
    times: dict[str, list[float]] = {label: [] for label in ways}
    for _ in range(args.rounds):
        for label, way in ways.items():
            times[label].append(_timed(way, kept))
    mb = args.batch * 224 * 224 * 3 / 1e6
    print(
        f"# {args.rounds} stacks of {args.batch} crops ({mb:.1f} MB) each way; transparent "
        f"huge pages: enabled={_setting('enabled')!r} defrag={_setting('defrag')!r}"
    )
    print(f"{'allocation':<22} {'median':>8} {'p90':>8} {'max':>8}")
    summary = {}
    for label, values in times.items():
        ordered = sorted(values)
        p90 = ordered[int(0.9 * (len(ordered) - 1))]
        summary[label] = (statistics.median(ordered), p90, ordered[-1])
        print(f"{label:<22} " + " ".join(f"{v * 1000:>6.1f}ms" for v in summary[label]))
    m0, p0, x0 = summary["numpy (madvised)"]
    for label in list(ways)[1:]:
        m1, p1, x1 = summary[label]
        print(f"{label} / numpy: median {m1 / m0:.2f}x, p90 {p1 / p0:.2f}x, max {x1 / x0:.2f}x")


if __name__ == "__main__":
    main()

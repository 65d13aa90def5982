"""Blocks to and from worker processes: shared memory against pickling through the pool's pipe.

Two pipelines with their work in 2 worker processes, each run in fresh processes with
``ZEPHON_WORKER_SHM=0`` (blocks pickled, as before) and ``=1`` (large buffers through shared
memory: fetched bytes on the way in, arrays on the way out), alternating, median of
``--rounds``:

1. transport: 20,000 samples of a local JSONL dataset, each mapped in a worker to a 224x224x3
   uint8 array (cheap to make: the trip back is the work), batches of 256;
2. images: 4,000 JPEGs of 300-500 px in local WebDataset tars, decode_image +
   random_resized_crop(224) + flip + batch(256).

    .venv/bin/python benchmarks/worker_results.py
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

BENCH = Path(__file__).resolve().parent


def image_of(sample: dict[str, Any]) -> dict[str, Any]:
    """A 224x224x3 image made from the sample's id (runs in a worker)."""
    return {"id": sample["id"], "jpg": np.full((224, 224, 3), sample["id"] % 251, np.uint8)}


def run(kind: str, folder: str) -> dict[str, float]:
    """One epoch in this process: images/s, the main process's CPU seconds, peak RSS of all
    processes."""
    from peer_run import TreeUsage
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    rss = TreeUsage().__enter__()
    t, cpu = time.perf_counter(), time.process_time()
    ds = Dataset.from_path(kind, folder, index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1)
    if kind == "transport":
        pipe = pipe.map(image_of, processes=2)
    else:
        pipe = pipe.decode_image("jpg", processes=2).random_resized_crop(224).flip()
    n = sum(len(batch["jpg"]) for batch in pipe.batch(256))
    rate, cpu = n / (time.perf_counter() - t), time.process_time() - cpu
    rss.__exit__()
    return {"rate": rate, "main_cpu": cpu, "rss_mb": rss.peak / 1e6}


def make_data(root: Path) -> dict[str, str]:
    sys.path.insert(0, str(BENCH))
    from images import jpegs, tars

    text = root / "text"
    text.mkdir()
    for s in range(4):
        lines = (json.dumps({"id": i}) for i in range(s * 5000, (s + 1) * 5000))
        (text / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    tar_dir = root / "tars"
    tar_dir.mkdir()
    for s, body in enumerate(tars(jpegs(4000), 8)):
        (tar_dir / f"part-{s:03d}.tar").write_bytes(body)
    return {"transport": str(text), "images": str(tar_dir)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folders = make_data(Path(tmp))
        print(f"# 2 worker processes, fresh process per run, median of {args.rounds}")
        print(
            f"{'pipeline':<12} {'pickled img/s':>14} {'shared img/s':>13} {'ratio':>6} "
            f"{'main CPU s (pickled / shared)':>30} "
            f"{'peak RSS MB (pickled / shared)':>31}"
        )
        for kind, folder in folders.items():
            runs: dict[str, list[dict[str, float]]] = {"0": [], "1": []}
            for _ in range(args.rounds):
                for flag in ("0", "1"):
                    env = {**os.environ, "ZEPHON_WORKER_SHM": flag}
                    cmd = [sys.executable, __file__, "--child", kind, folder]
                    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
                    runs[flag].append(json.loads(out.stdout.splitlines()[-1]))
            rate = {f: statistics.median(r["rate"] for r in runs[f]) for f in runs}
            cpu = {f: statistics.median(r["main_cpu"] for r in runs[f]) for f in runs}
            rss = {f: statistics.median(r["rss_mb"] for r in runs[f]) for f in runs}
            print(
                f"{kind:<12} {rate['0']:>14,.0f} {rate['1']:>13,.0f} "
                f"{rate['1'] / rate['0']:>5.2f}x {cpu['0']:>23.2f} / {cpu['1']:<5.2f} "
                f"{rss['0']:>23,.0f} / {rss['1']:,.0f}"
            )


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.path.insert(0, str(BENCH))
        from worker_results import run as run_child  # importable by the workers

        print(json.dumps(run_child(sys.argv[2], sys.argv[3])))
    else:
        main()

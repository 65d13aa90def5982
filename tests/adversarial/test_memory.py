"""Memory is bounded by bytes, whatever the record size: decoded blocks and the buffers
between stages are bounded in bytes as well as in blocks, and a chunk of large records is
read and put back in order a window at a time (``benchmarks/memory.py`` measures the full
400 MB case)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import json, sys, time
from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

ds = Dataset.from_path("big", sys.argv[1])
ws = StaticMixtureWorkSource([ds], seed=1, shuffle=sys.argv[2])
window, pause = int(sys.argv[3]), float(sys.argv[4])
pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, fetch_budget_bytes=8 << 20,
                range_cache_bytes=8 << 20).map(fns.double)
if window:
    pipe = pipe.shuffle(window, warmup=0)
pipe = pipe.batch(4)
before, ids = rss_mb(), []
for batch in pipe:
    ids.extend(int(i) for i in batch["id"])
    time.sleep(pause)  # a slow consumer: the pipeline runs ahead and fills its buffers
print(json.dumps({"growth": peak_mb() - before, "ids": sorted(ids)}))
"""


@pytest.fixture(scope="module")
def large_records(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("large-records")
    body = "x" * (256 << 10)
    for s in range(4):  # 4 x 128 records of 256 KiB: 128 MiB, within one chunk
        with open(root / f"part-{s}.jsonl", "w") as f:
            for i in range(128):
                f.write(json.dumps({"id": s * 128 + i, "text": body}) + "\n")
    return root


def run(large_records: Path, shuffle: str, window: int, pause_s: float) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(large_records), shuffle, str(window), str(pause_s)],
        capture_output=True,
        text=True,
        timeout=100,
        env=env,
        cwd=ROOT,
        check=True,
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(120)
@pytest.mark.parametrize("shuffle", ["block", "global"])
def test_large_records_stay_within_the_byte_bounds(large_records: Path, shuffle: str) -> None:
    result = run(large_records, shuffle, 0, 0.002)
    assert result["ids"] == list(range(512))  # every record once
    # 8 MiB of fetches, 8 MiB of cache, blocks of about 2 MiB and channels of about 2 MiB.
    # Measured peak growth on 2026-12-04: block 93-109 MiB, global 39-64 MiB (the bound was
    # 110 and failed once at 111 under a parallel test run). The 128 MiB chunk never sits in
    # memory at once; it did before (about 150 MiB of growth, plus the chunk's decoded copy).
    assert result["growth"] < 125, result["growth"]


@pytest.mark.timeout(120)
def test_a_shuffle_window_of_large_records_leaves_in_blocks_of_bounded_bytes(
    large_records: Path,
) -> None:
    """A shuffle emits a window as one block; whole windows of large records in every channel
    after it (and their bytes not counted) held several times the window. Measured on
    2026-12-05 (shuffle(32) of 256 KiB records, 8 MiB a lane's window, a consumer at 20 ms a
    batch): 169-176 MiB of growth before, 93 after."""
    result = run(large_records, "block", 32, 0.02)
    assert result["ids"] == list(range(512))
    assert result["growth"] < 125, result["growth"]

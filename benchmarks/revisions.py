"""Two revisions of Zephon side by side in one run: is a change within noise?

The base revision's ``src/`` is exported (``git archive``) to a temporary directory; every
measurement runs in a child process whose ``PYTHONPATH`` picks either tree, base and head
alternating in a rotated order each round, and the medians are compared.

- ``pipeline``: one pass through the pipeline from one moto server (JSONL and Parquet,
  ~100-byte rows, shuffles ``none`` and ``block``), and trivial-op throughput over in-memory
  data with one and four lanes. Samples/s, head / base.
- ``planner``: ``benchmarks/planner.py``'s children (every shuffle mode, the 70/30 mixture):
  planned pointers/s and peak RSS, head / base.
- ``images``: 400 synthetic JPEGs (300-500 px) in memory through decode_image +
  random_resized_crop(224) + flip + to_chw + batch(64), in process and with 2 worker
  processes: images/s.
- ``stall``: 4,000 ~1.6 KB documents in memory through tokenize("bytes") + shuffle(1024) +
  pack(2048) + batch(8) on 4 lanes: the loader alone (batches/s), and a consumer that takes
  20 ms per batch (its mean wait per batch after the first, in microseconds: lower is better).
- ``small``: an endless curriculum over a dataset smaller than a chunk (1 or 40 in-memory
  records, so a chunk spans hundreds of passes): the first batch of 4, fresh and after
  ``restore()`` of a checkpoint taken 10 batches in, in microseconds (median of the passes).

    .venv/bin/python benchmarks/revisions.py --base HEAD~1 pipeline
    .venv/bin/python benchmarks/revisions.py --base HEAD~1 planner --rounds 3
    .venv/bin/python benchmarks/revisions.py --base HEAD~1 small --rounds 3
    .venv/bin/python benchmarks/revisions.py --base HEAD~1 images --rounds 3
    .venv/bin/python benchmarks/revisions.py --base HEAD~1 stall --rounds 3

The base tree gets the working tree's compiled JPEG binding when its C source is the same
(``git archive`` holds sources only), so both decode through the same code.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PIPELINE_CASES = ["jsonl:none", "jsonl:block", "parquet:none", "parquet:block",
                  "trivial:1", "trivial:4"]  # fmt: skip
PLANNER_CASES = ["none", "shards", "block", "global", "block+mix", "global+mix"]
SMALL_CASES = ["small-none:1", "small-block:1", "small-block:40", "small-global:40"]
IMAGE_CASES = ["images:0", "images:2"]
STALL_CASES = ["stall:loader", "stall:20ms"]


def export(rev: str, into: Path) -> Path:
    """``src/`` of ``rev`` under ``into``; returns the directory to put on ``PYTHONPATH``."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", rev, "src"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    source = into / "src" / "zephon" / "_jpeg.c"
    if source.exists() and source.read_bytes() == (ROOT / "src/zephon/_jpeg.c").read_bytes():
        for built in (ROOT / "src" / "zephon").glob("_jpeg*.so"):
            shutil.copy(built, into / "src" / "zephon" / built.name)
    return into / "src"


def child_pipeline(case: str, endpoint_url: str, passes: int) -> dict[str, float]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.testing import S3Endpoint

    kind, mode = case.split(":")
    if kind == "trivial":
        records = [{"id": i, "text": "x" * (i % 50)} for i in range(200_000)]
        ds = Dataset.from_records("mem", records, samples_per_shard=10_000)
        ws, lanes = StaticMixtureWorkSource([ds], shuffle="block"), int(mode)
    else:
        options = S3Endpoint(endpoint_url).storage_options()
        prefix = "jsonl/" if kind == "jsonl" else "pq/"
        ds = Dataset.from_path(kind, f"s3://bench/{prefix}", storage_options=options)
        ws = StaticMixtureWorkSource([ds], shuffle=mode, stop_after_passes=1)
        lanes = 1

    async def one() -> float:
        started, n = time.perf_counter(), 0
        pipe = Pipeline(ws, rank=0, world_size=1, lanes=lanes, max_inflight_requests=16)
        async for _ in pipe.map(_identity) if kind == "trivial" else pipe:
            n += 1
        assert n == ds.num_samples, (n, ds.num_samples)
        return n / (time.perf_counter() - started)

    asyncio.run(one())  # warm-up: imports, connections, index cache
    return {"rate": statistics.median(asyncio.run(one()) for _ in range(passes))}


def child_small(case: str, passes: int) -> dict[str, float]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    mode, size = case.removeprefix("small-").split(":")
    ds = Dataset.from_records("small", [{"id": i} for i in range(int(size))])
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle=mode, stop_after_passes=None)

    def first_batch(state: dict[str, Any] | None) -> tuple[float, dict[str, Any]]:
        pipe = Pipeline(ws, rank=0, world_size=1).batch(4)
        if state is not None:
            pipe.restore(state)
        started = time.perf_counter()
        it = pipe.iter()
        next(it)
        took = time.perf_counter() - started
        for _ in range(10):
            next(it)
        saved = pipe.checkpoint()
        it.close()
        return took, saved

    _, state = first_batch(None)  # warm-up: imports, the loop's first use
    fresh = [first_batch(None)[0] for _ in range(passes)]
    restored = [first_batch(state)[0] for _ in range(passes)]
    return {
        "first_us": statistics.median(fresh) * 1e6,
        "restore_us": statistics.median(restored) * 1e6,
    }


def child_images(case: str, passes: int) -> dict[str, float]:
    import numpy as np
    from PIL import Image

    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    processes = int(case.split(":")[1])
    rng = np.random.default_rng(0)
    root = Path(tempfile.mkdtemp(prefix="zephon-images-"))
    atexit.register(shutil.rmtree, root, True)
    for s in range(4):  # WebDataset tars on local disk
        with tarfile.open(root / f"part-{s}.tar", "w") as tar:
            for i in range(100):
                h, w = (int(x) for x in rng.integers(300, 500, size=2))
                buf = io.BytesIO()
                pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(buf, "JPEG", quality=85)
                member = tarfile.TarInfo(f"{s * 100 + i:05d}.jpg")
                member.size = len(buf.getvalue())
                tar.addfile(member, io.BytesIO(buf.getvalue()))
    ds = Dataset.from_path("images", str(root), index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="none", stop_after_passes=1)
    pipe = (
        Pipeline(ws, rank=0, world_size=1)
        .decode_image(processes=processes)
        .random_resized_crop(224)
        .flip()
        .to_chw()
        .batch(64)
    )

    def one() -> float:
        started = time.perf_counter()
        n = sum(len(b["jpg"]) for b in pipe)
        assert n == 400, n
        return n / (time.perf_counter() - started)

    one()  # warm-up: imports, the worker pool's start
    return {"rate": statistics.median(one() for _ in range(passes))}


def child_stall(case: str, passes: int) -> dict[str, float]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    words = ["data", "loader", "stream", "token", "shard", "batch", "epoch", "model"]
    docs = [
        {"text": " ".join(words[(i * 7 + j) % 8] for j in range(280 + i % 40))} for i in range(4000)
    ]
    ds = Dataset.from_records("docs", docs, samples_per_shard=250)
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="block", stop_after_passes=None)
    step = 0.02 if case.endswith("20ms") else 0.0

    def one() -> float:
        pipe = (
            Pipeline(ws, rank=0, world_size=1, lanes=4)
            .tokenize("bytes")
            .shuffle(1024)
            .pack(2048)
            .batch(8)
        )
        it = pipe.iter()
        next(it)
        waited, started = 0.0, time.perf_counter()
        for _ in range(60):
            t = time.perf_counter()
            next(it)
            waited += time.perf_counter() - t
            if step:
                time.sleep(step)  # the trainer's step
        took = time.perf_counter() - started
        it.close()
        return waited / 60 * 1e6 if step else 60 / took

    one()
    key = "wait_us" if step else "batches_per_s"
    return {key: statistics.median(one() for _ in range(passes))}


def _identity(sample: Any) -> Any:
    return sample


def run_child(tree: Path, args: list[str]) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": f"{tree}{os.pathsep}{HERE}"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env)
    if out.returncode:
        raise SystemExit(f"{' '.join(args)} failed under {tree}:\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def compare(trees: dict[str, Path], cases: list[str], command: Any, rounds: int) -> None:
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    names = list(trees)
    for r in range(rounds):
        for case in cases:
            for name in names[r % 2 :] + names[: r % 2]:  # no side always first
                results.setdefault((case, name), []).append(run_child(trees[name], command(case)))
    print(f"{'case':<14} {'measure':<14} {'base':>12} {'head':>12} {'head/base':>10}")
    for case in cases:
        for m in results[(case, "head")][0]:
            base = statistics.median(x[m] for x in results[(case, "base")])
            head = statistics.median(x[m] for x in results[(case, "head")])
            print(f"{case:<14} {m:<14} {base:>12,.0f} {head:>12,.0f} {head / base:>9.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "suite",
        nargs="?",
        choices=["pipeline", "planner", "small", "images", "stall"],
        default="pipeline",
    )
    parser.add_argument("--base", default="HEAD", help="git revision to compare against")
    parser.add_argument("--head", default=None, help="git revision (default: the working tree)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--passes", type=int, default=3, help="timed passes per child")
    parser.add_argument("--pointers", type=int, default=1_000_000, help="planner pointers")
    parser.add_argument("--cases", default=None, help="comma-separated subset of the cases")
    parser.add_argument("--child", nargs=2, default=None, metavar=("CASE", "ENDPOINT"))
    args = parser.parse_args()
    if args.child:
        case, endpoint = args.child
        if case.startswith("small-"):
            out = child_small(case, args.passes)
        elif case.startswith("images:"):
            out = child_images(case, args.passes)
        elif case.startswith("stall:"):
            out = child_stall(case, args.passes)
        else:
            out = child_pipeline(case, endpoint, args.passes)
        print(json.dumps(out))
        return
    with tempfile.TemporaryDirectory(prefix="zephon-base-") as tmp:
        head = ROOT / "src" if args.head is None else export(args.head, Path(tmp) / "head")
        trees = {"base": export(args.base, Path(tmp) / "base"), "head": head}
        print(
            f"# base {args.base} against {args.head or 'the working tree'}, "
            f"median of {args.rounds} rounds"
        )
        if args.suite == "planner":
            cmd = [str(HERE / "planner.py"), "--pointers", str(args.pointers), "--child"]

            def planner(case: str) -> list[str]:
                mode, _, mix = case.partition("+")
                return [*cmd, mode] + (["--mix"] if mix else [])

            compare(trees, _subset(PLANNER_CASES, args.cases), planner, args.rounds)
            return
        suites = {"small": SMALL_CASES, "images": IMAGE_CASES, "stall": STALL_CASES}
        if args.suite in suites:
            me = str(Path(__file__).resolve())

            def local(case: str) -> list[str]:
                return [me, "--passes", str(args.passes), "--child", case, "-"]

            compare(trees, _subset(suites[args.suite], args.cases), local, args.rounds)
            return
        pipeline_suite(trees, args)


def _subset(cases: list[str], chosen: str | None) -> list[str]:
    if chosen is None:
        return cases
    wanted = chosen.split(",")
    unknown = sorted(set(wanted) - set(cases))
    if unknown:
        raise SystemExit(f"unknown cases {unknown}; choose from {cases}")
    return wanted


def pipeline_suite(trees: dict[str, Path], args: argparse.Namespace) -> None:
    sys.path.insert(0, str(HERE))
    from pipeline import jsonl_shard, parquet_shard
    from zephon.testing import MotoServer

    with MotoServer() as endpoint:
        endpoint.create_bucket("bench")
        client = endpoint.client()
        for i in range(16):
            client.put_object(
                Bucket="bench", Key=f"jsonl/p{i:04d}.jsonl", Body=jsonl_shard(i, 10_000)
            )
            client.put_object(
                Bucket="bench", Key=f"pq/p{i:04d}.parquet", Body=parquet_shard(i, 10_000)
            )
        print("# pipeline: 16 shards x 10,000 rows from moto; trivial: 200,000 in-memory rows")
        me = str(Path(__file__).resolve())

        def command(case: str) -> list[str]:
            return [me, "--passes", str(args.passes), "--child", case, endpoint.endpoint_url]

        compare(trees, _subset(PIPELINE_CASES, args.cases), command, args.rounds)


if __name__ == "__main__":
    main()

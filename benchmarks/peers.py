"""Zephon against its peers, side by side in one run, each peer in its own virtual environment.

One moto server holds the same 64,000 documents (~1.6 KB of text each, 16 shards) in every
system's own format, written by the system's own writer: JSONL and Parquet (Zephon, and the
original zephon 0.2.0 on JSONL), MDS (``MDSWriter``), LitData chunks (``litdata.optimize``) and
WebDataset tars (``TarWriter``; Zephon reads those too). Every reader runs one shuffled epoch in
a fresh process with an empty local cache, through a latency proxy in its own process (0 and
+30 ms per request), in the main process and with 2 workers. Printed per run (median of
``--rounds`` by wall time): time to the first sample, samples/s over the epoch (start-up
included), peak resident memory of all its processes, local disk left behind, requests and bytes
fetched, the epoch's samples/s against LitData's and its wall time against the Floor row's, and
CPU seconds of the reader's main process (the trainer's) and of all its processes. The row
``engine='process'`` runs Zephon's whole pipeline in a child process, batches of 64 crossing to
the trainer (its lanes: the workers column), as a trainer that holds the GIL would. The last
rows, ``Floor``, are no readers: the JSONL objects (or the tars) fetched whole, all at once,
lines counted and nothing parsed, the least any reader of these bytes through this server needs.
With ``--neighbour`` every reader also runs beside one CPU-bound process (what a trainer's own
threads do to a loader).

The venvs (``.venv-peers/<peer>``, torch pinned to 2.13.0) are created on first use.

    make bench-peers            # or: .venv/bin/python benchmarks/peers.py [--rounds 3]
    .venv/bin/python benchmarks/peers.py --latency-ms 30 --neighbour
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import text
from zephon import Dataset
from zephon.testing import MotoServer, ProxyProcess

ROOT = Path(__file__).resolve().parent.parent
RUNNER = Path(__file__).resolve().parent / "peer_run.py"
VENVS = ROOT / ".venv-peers"
PEERS = {  # venv name -> what it installs
    "litdata": ["litdata==0.2.76", "torch==2.13.0", "boto3"],
    "mosaic": ["mosaicml-streaming==0.13.0", "torch==2.13.0"],
    "webdataset": ["webdataset==1.0.2", "torch==2.13.0", "numpy", "pillow"],
    "zephon-0.2.0": ["zephon[cloud]==0.2.0"],
}
# PyPI's torchvision does not load beside the pinned torch; MDS for text never needs it.
REMOVE = {"mosaic": ["torchvision"]}
SHARDS, PER_SHARD = 16, 4000
BUCKET = "peers"


def compile_zephon() -> None:
    """Byte-compile Zephon's sources, as pip does for every package it installs (the peers'
    included): an editable install under ``PYTHONDONTWRITEBYTECODE`` would otherwise compile
    each module anew on every import, inside the measured start-up."""
    compileall.compile_dir(str(ROOT / "src" / "zephon"), quiet=1)


def peer_python(name: str) -> str:
    """The peer's interpreter, its venv created and filled on first use."""
    venv = VENVS / name
    stamp = venv / ".installed"
    wanted = " ".join(PEERS[name])
    if not stamp.exists() or stamp.read_text() != wanted:
        print(f"# installing {wanted} into {venv} ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin/pip"), "install", "-q", *PEERS[name]], check=True)
        if REMOVE.get(name):
            subprocess.run(
                [str(venv / "bin/pip"), "uninstall", "-q", "-y", *REMOVE[name]], check=True
            )
        stamp.write_text(wanted)
    return str(venv / "bin/python")


def write_documents(where: Path) -> int:
    """JSONL shards of the documents; returns the sum of their ids."""
    where.mkdir(parents=True)
    for s in range(SHARDS):
        with (where / f"part-{s:03d}.jsonl").open("w") as f:
            for i in range(s * PER_SHARD, (s + 1) * PER_SHARD):
                f.write(json.dumps({"id": i, "text": text(i, "docs")}) + "\n")
    n = SHARDS * PER_SHARD
    return n * (n - 1) // 2


def write_parquet(docs: Path, where: Path) -> None:
    where.mkdir(parents=True)
    for path in sorted(docs.glob("*.jsonl")):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        table = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows]})
        pq.write_table(table, where / (path.stem + ".parquet"), row_group_size=1000)


def upload(client: Any, local: Path, prefix: str) -> int:
    total = 0
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        client.upload_file(str(path), BUCKET, f"{prefix}/{path.relative_to(local)}")
        total += path.stat().st_size
    return total


def prepare(endpoint: Any, work: Path) -> dict[str, int]:
    """Every format written and uploaded; returns the bytes of each prefix."""
    client = endpoint.client()
    client.create_bucket(Bucket=BUCKET)
    docs = work / "docs"
    write_documents(docs)
    write_parquet(docs, work / "parquet")
    sizes = {
        "jsonl": upload(client, docs, "jsonl"),
        "jsonl-index": upload(client, docs, "jsonl-index"),
        "parquet": upload(client, work / "parquet", "parquet"),
    }
    options = endpoint.storage_options()
    indexed = Dataset.from_path(
        "web", f"s3://{BUCKET}/jsonl-index/", storage_options=options, index_cache=False
    )
    asyncio.run(indexed.awrite_index())
    for peer, prefix in (("mosaic", "mds"), ("litdata", "litdata"), ("webdataset", "wds")):
        out = work / prefix
        out.mkdir()
        subprocess.run(
            [peer_python(peer), str(RUNNER), "write", peer, str(docs), str(out)],
            check=True,
            capture_output=True,
        )
        sizes[prefix] = upload(client, out, prefix)
    tars = Dataset.from_path(
        "web",
        f"s3://{BUCKET}/wds/",
        format="webdataset",
        storage_options=options,
        index_cache=False,
    )
    asyncio.run(tars.awrite_index(f"s3://{BUCKET}/indexes/wds.json"))
    return sizes


ROWS = [  # label, venv (None: ours), system, prefix, extra environment
    ("Zephon, JSONL (no index)", None, "zephon", "jsonl", {}),
    ("Zephon, JSONL, persistent index", None, "zephon", "jsonl-index", {}),
    ("Zephon, Parquet", None, "zephon", "parquet", {}),
    ("Zephon, WebDataset tars", None, "zephon", "wds", {"PEER_FORMAT": "webdataset"}),
    ("Zephon, tars, persistent index", None, "zephon", "wds",
     {"PEER_FORMAT": "webdataset", "PEER_INDEX": f"s3://{BUCKET}/indexes/wds.json"}),
    ("Zephon, JSONL, engine='process'", None, "zephon", "jsonl-index",
     {"PEER_ENGINE": "process"}),
    ("Zephon, MDS", None, "zephon", "mds", {}),
    ("Zephon, LitData chunks", None, "zephon", "litdata", {}),
    ("LitData 0.2.76", "litdata", "litdata", "litdata", {}),
    ("MosaicML Streaming 0.13.0", "mosaic", "mosaic", "mds", {}),
    ("WebDataset 1.0.2 (http)", "webdataset", "webdataset", "wds", {}),
    ("original zephon 0.2.0", "zephon-0.2.0", "zephon-0.2.0", "jsonl", {}),
    ("Floor: JSONL bytes, no parsing", None, "floor", "jsonl", {}),
    ("Floor: tar bytes (twice JSONL's)", None, "floor", "wds", {}),
]  # fmt: skip


def with_presigned(
    row: tuple[Any, ...], endpoint: Any, via: str, bucket: str = BUCKET
) -> tuple[Any, ...]:
    """WebDataset reads plain URLs: its row gets presigned ones (the bucket is private),
    through the latency proxy, in ``PEER_URLS``."""
    if row[2] != "webdataset":
        return row
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=via,
        aws_access_key_id=endpoint.key,
        aws_secret_access_key=endpoint.secret,
        region_name="us-east-1",
    )
    keys = sorted(
        o["Key"]
        for o in endpoint.client().list_objects_v2(Bucket=bucket, Prefix=f"{row[3]}/")["Contents"]
    )
    urls = [
        client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": k}, ExpiresIn=3600
        )
        for k in keys
    ]
    return (*row[:4], {**row[4], "PEER_URLS": json.dumps(urls)})


NEIGHBOUR = "while True: pass"  # one core kept busy, as a trainer's own threads do


def run_one(
    row: tuple[Any, ...],
    proxy: ProxyProcess,
    endpoint: Any,
    workers: int,
    work: Path,
    runner: Path = RUNNER,
    bucket: str = BUCKET,
    neighbour: bool = False,
) -> dict[str, Any]:
    """One epoch of one reader in a fresh process (with ``neighbour``, one CPU-bound process
    runs beside it from before it starts to after it ends)."""
    busy = subprocess.Popen([sys.executable, "-c", NEIGHBOUR]) if neighbour else None
    try:
        return _run_reader(row, proxy, endpoint, workers, work, runner, bucket)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()


def _run_reader(
    row: tuple[Any, ...],
    proxy: ProxyProcess,
    endpoint: Any,
    workers: int,
    work: Path,
    runner: Path,
    bucket: str,
) -> dict[str, Any]:
    _, venv, system, prefix, extra = row
    python = sys.executable if venv is None else peer_python(venv)
    cache = Path(tempfile.mkdtemp(dir=work, prefix="cache-"))
    url = f"{proxy.url}/{bucket}/{prefix}" if system == "webdataset" else f"s3://{bucket}/{prefix}/"
    env = {
        **os.environ,
        **extra,
        "AWS_ENDPOINT_URL": proxy.url,
        "S3_ENDPOINT_URL": proxy.url,
        "AWS_ACCESS_KEY_ID": endpoint.key,
        "AWS_SECRET_ACCESS_KEY": endpoint.secret,
        "AWS_DEFAULT_REGION": "us-east-1",
        "PEER_SAMPLES": str(SHARDS * PER_SHARD),
        "AWS_ALLOW_HTTP": "true",
        "ZEPHON_CACHE_DIR": str(cache / "zephon"),
        "HOME": str(cache),
    }
    proxy.served(reset=True)
    try:
        out = subprocess.run(
            [python, str(runner), "read", system, url, str(cache), str(workers)],
            capture_output=True,
            text=True,
            env=env,
            timeout=240,
            cwd=str(work),
        )
        if out.returncode == 0:
            result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            result = {"error": out.stderr[-600:]}
    except subprocess.TimeoutExpired:
        result = {"error": "timed out after 240 s"}
    result.update(proxy.served())
    shutil.rmtree(cache, ignore_errors=True)
    return result


def median_run(results: list[dict[str, Any]]) -> dict[str, Any]:
    good = sorted((r for r in results if "error" not in r), key=lambda r: r["wall_s"])
    if not good:
        return results[-1]
    best = dict(good[len(good) // 2])
    best["failed"] = len(results) - len(good)
    return best


def table(results: dict[str, dict[str, Any]], sizes: dict[str, int], expected: int) -> None:
    """One row per reader: ``vs LitData`` is samples/s against LitData's (above 1: faster),
    ``x Floor`` the wall time against the Floor row's, CPU the epoch's CPU seconds of the
    reader's main process (the trainer's) and of all its processes."""
    litdata = results["LitData 0.2.76"].get("wall_s")
    floor = results["Floor: JSONL bytes, no parsing"].get("wall_s")
    print(
        f"{'system':<34} {'import':>7} {'first':>7} {'samples/s':>10} {'CPU main':>8} "
        f"{'CPU all':>7} {'RSS MB':>7} {'disk MB':>8} {'requests':>8} {'MB fetched':>15} "
        f"{'vs LitData':>10} {'x Floor':>8}"
    )
    for label, _, _, prefix, _ in ROWS:
        r = results[label]
        if "error" in r:
            print(f"{label:<34} failed: {r['error'].strip().splitlines()[-1][:90]}")
            continue
        ok = r["samples"] == SHARDS * PER_SHARD and r["id_sum"] in (expected, 0)
        data = sizes[prefix] / 1e6
        fetched = f"{r['bytes'] / 1e6:.0f} ({r['bytes'] / 1e6 / data:.2f}x)"
        flags = "" if ok else f"  WRONG: {r['samples']} samples"
        flags += f"  ({r['failed']} of the runs failed)" if r.get("failed") else ""
        rate = r["samples"] / r["wall_s"]
        faster = f"{litdata / r['wall_s']:>9.2f}x" if litdata else f"{'-':>10}"
        print(
            f"{label:<34} {r['import_s']:>6.2f}s {r['first_s']:>6.2f}s {rate:>10,.0f} "
            f"{r['cpu_main_s']:>7.2f}s {r['cpu_all_s']:>6.2f}s {r['peak_rss_mb']:>7.0f} "
            f"{r['disk_mb']:>8.0f} {r['requests']:>8} {fetched:>15} {faster} "
            f"{_ratio(r['wall_s'], floor)}{flags}"
        )


def _ratio(wall: float, reference: float | None) -> str:
    return f"{wall / reference:>8.2f}x" if reference else f"{'-':>9}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=int, nargs="*", default=[0, 30])
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    parser.add_argument("--only", nargs="*", default=None, help="labels' first words to run")
    parser.add_argument(
        "--neighbour",
        action="store_true",
        help="also run every reader beside one CPU-bound process",
    )
    args = parser.parse_args()
    compile_zephon()
    neighbours = [False, True] if args.neighbour else [False]
    rows = [r for r in ROWS if args.only is None or any(r[0].startswith(o) for o in args.only)]
    work = Path(tempfile.mkdtemp(prefix="zephon-peers-"))
    try:
        with MotoServer() as endpoint:
            sizes = prepare(endpoint, work)
            expected = SHARDS * PER_SHARD * (SHARDS * PER_SHARD - 1) // 2
            print(
                f"# {SHARDS * PER_SHARD:,} documents; MB per format: "
                + ", ".join(f"{k} {v / 1e6:.0f}" for k, v in sizes.items())
            )
            for latency in args.latency_ms:
                proxy = ProxyProcess(endpoint.endpoint_url, latency / 1000)
                proxy.start()
                try:
                    for workers, busy in itertools.product(args.workers, neighbours):
                        runs: dict[str, list[dict[str, Any]]] = {r[0]: [] for r in rows}
                        signed = [with_presigned(r, endpoint, proxy.url) for r in rows]
                        for _ in range(args.rounds):  # rounds interleave the systems
                            for row in signed:
                                runs[row[0]].append(
                                    run_one(row, proxy, endpoint, workers, work, neighbour=busy)
                                )
                        print(
                            f"\n# +{latency} ms per request, "
                            f"{'main process' if not workers else f'{workers} workers'}, "
                            f"{'beside one CPU-bound process' if busy else 'quiet'}, "
                            f"median of {args.rounds} by wall time, "
                            f"load {os.getloadavg()[0]:.1f}"
                        )
                        results = {label: median_run(v) for label, v in runs.items()}
                        for r in ROWS:
                            results.setdefault(r[0], {"error": "not run"})
                        table(results, sizes, expected)
                finally:
                    proxy.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

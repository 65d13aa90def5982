"""Image decoding and augmentation: which decoder, what draft mode saves, and the pipeline
against a bare loop.

1. 400 synthetic JPEGs of 300-500 px (quality 85), decoded and random-resized-cropped to 224
   by: Pillow; libjpeg-turbo through ``simplejpeg``; both with DCT draft scaling
   (``max_size=224``); the crop resized by Pillow or OpenCV. Images/s in one process,
   median of 3.
2. 4,000 such JPEGs with labels in WebDataset tars on the local S3 server (moto) behind a
   latency proxy (+30 ms): Zephon (decode_image + random_resized_crop(224) + flip + to_chw +
   batch(256), ``processes=2``) against a bare loop doing the same decode and crop on the
   same bytes held in memory by a pool of 2 processes. Images/s over one epoch, first batch,
   bytes fetched, and the CPU time of Zephon's own process (user and system).
3. ``--peers``: ``--images`` such JPEGs (default 20,000) with labels, written by each system's own
   writer (WebDataset ``TarWriter``, ``litdata.optimize``, ``MDSWriter``; Parquet files of
   ``id`` and ``jpg`` with row groups of 256 images, read by Zephon), on one moto server at
   +30 ms; decode -> random-resized-crop 224 -> flip -> batches of 256 with 2 worker processes
   (Zephon: ``processes=2``; peers: DataLoader ``num_workers=2``), one shuffled epoch each in a
   fresh process (``benchmarks/peer_images.py`` in each peer's venv), against the bare
   2-process loop of Zephon's decoder (in every round). Images/s, import time, first batch
   (imports excluded, as in peer_run.py), peak RSS of all processes, requests and bytes
   fetched.

    .venv/bin/python benchmarks/images.py                         # parts 1 and 2
    .venv/bin/python benchmarks/images.py --peers --images 20000   # part 3
    .venv/bin/python benchmarks/images.py --peers --only Zephon --rounds 3   # part 3, some rows
    .venv/bin/python benchmarks/images.py --peers --workers 0 2   # main process, 2 workers
"""

from __future__ import annotations

import argparse
import asyncio
import io
import multiprocessing as mp
import os
import resource
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
import timeit
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops import jpeg
from zephon.ops.image import Flip, RandomResizedCrop, ToCHW
from zephon.ops.imagedecode import DecodeImage
from zephon.ops.transform import Chain
from zephon.testing import MotoServer, ProxyProcess

DECODE = DecodeImage("jpg")
CROP = RandomResizedCrop(224, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
FLIP = Flip("jpg", 0.5, seed=0)


# The pipeline's worker call for these steps: only the crop of each JPEG is decoded when
# zephon._jpeg was built (ops/jpeg.py), else decode, crop, flip one after the other.
STEPS = Chain([("map", DECODE), ("map", CROP), ("map", FLIP)])


def bare(item: tuple[int, bytes]) -> np.ndarray:
    """The bare loop's work for one image: decode, crop, flip (as the pipeline's worker
    call does); the pixels go back to the parent, as a trainer needs them."""
    image: np.ndarray = STEPS({"id": item[0], "jpg": item[1]})["jpg"]
    return image


def bare_rate(data: list[bytes]) -> float:
    """Images/s of the bare loop: 2 processes, the bytes in memory, batches of 256 stacked."""
    with mp.get_context("forkserver").Pool(2) as pool:
        pool.map(bare, list(enumerate(data[:8])))  # warm the workers
        t = time.perf_counter()
        out = pool.imap(bare, enumerate(data), chunksize=16)
        done = 0
        while batch := [x for _, x in zip(range(256), out, strict=False)]:
            done += len(np.stack(batch))
        return done / (time.perf_counter() - t)


def tars(data: list[bytes], shards: int) -> list[bytes]:
    per = -(-len(data) // shards)
    out = []
    for s in range(shards):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(s * per, min(len(data), (s + 1) * per)):
                for ext, body in (("jpg", data[i]), ("cls", str(i % 1000).encode())):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
        out.append(buf.getvalue())
    return out


def pipeline_vs_bare(n: int) -> None:
    data = jpegs(n)
    size = sum(map(len, data))
    bare = bare_rate(data)
    with MotoServer() as endpoint:
        endpoint.create_bucket("img")
        for s, body in enumerate(tars(data, 8)):
            endpoint.client().put_object(Bucket="img", Key=f"wds/part-{s:03d}.tar", Body=body)
        proxy = ProxyProcess(endpoint.endpoint_url, 0.03)
        url = proxy.start()
        try:
            os.environ.update(
                {
                    "AWS_ENDPOINT_URL": url,
                    "AWS_ACCESS_KEY_ID": endpoint.key,
                    "AWS_SECRET_ACCESS_KEY": endpoint.secret,
                    "AWS_DEFAULT_REGION": "us-east-1",
                }
            )
            before = resource.getrusage(resource.RUSAGE_SELF)
            t = time.perf_counter()
            ds = Dataset.from_path("imgs", "s3://img/wds/", index_cache=False)
            ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
            pipe = (
                Pipeline(ws, rank=0, world_size=1)
                .decode_image("jpg", processes=2)
                .random_resized_crop(224)
                .flip()
                .to_chw()
                .batch(256)
            )
            first, images = None, 0
            for batch in pipe:
                first = first if first is not None else time.perf_counter() - t
                images += len(batch["jpg"])
            wall = time.perf_counter() - t
            after = resource.getrusage(resource.RUSAGE_SELF)
            fetched = proxy.served()["bytes"]
        finally:
            proxy.stop()
    rate = images / wall
    print(
        f"\n# 2. {n:,} JPEGs ({size / 1e6:.0f} MB) in WebDataset tars at +30 ms: "
        "decode + random_resized_crop(224) + flip, 2 processes"
    )
    print(f"bare loop (2 processes, bytes in memory): {bare:,.0f} images/s")
    print(
        f"Zephon (processes=2, batch 256):          {rate:,.0f} images/s "
        f"({rate / bare:.2f}x the bare loop; target >= 0.9x), first batch {first:.2f} s, "
        f"{fetched / 1e6:.0f} MB fetched ({fetched / size:.2f}x the data)"
    )
    user, system = after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime
    print(
        f"Zephon's main process: {user:.2f} s user + {system:.2f} s system CPU over "
        f"{wall:.2f} s ({(user + system) / wall:.0%} of a core; the workers, moto and the "
        "proxy share the rest of the machine)"
    )


def jpegs(n: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    out = []
    for i in range(n):
        h, w = int(rng.integers(300, 501)), int(rng.integers(300, 501))
        y, x = np.mgrid[0:h, 0:w]
        base = np.stack([x * 255 // w, y * 255 // h, (x + y) % 256], axis=-1).astype(np.uint8)
        noise = rng.integers(0, 40, (h, w, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(base + noise).save(buf, format="JPEG", quality=85)
        out.append(buf.getvalue())
        del i
    return out


def part1() -> None:
    data = jpegs(400)
    by_opencv = RandomResizedCrop(224, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), 0, "opencv")
    by_pillow = RandomResizedCrop(224, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), 0, "pillow")
    cases = {  # decoder, crop's resizer
        "pillow / pillow": (DecodeImage("jpg", backend="pillow"), by_pillow),
        "pillow, draft 224 / pillow": (
            DecodeImage("jpg", backend="pillow", max_size=224),
            by_pillow,
        ),
        "simplejpeg / pillow": (DecodeImage("jpg", backend="simplejpeg"), by_pillow),
        "simplejpeg / opencv": (DecodeImage("jpg", backend="simplejpeg"), by_opencv),
        "simplejpeg, draft 224 / opencv": (
            DecodeImage("jpg", backend="simplejpeg", max_size=224),
            by_opencv,
        ),
    }
    print(f"# {len(data)} JPEGs of 300-500 px: decode -> random_resized_crop(224), one process")
    print(f"{'decoder / resizer':<32} {'decode img/s':>13} {'+ crop img/s':>13}")
    for name, (decode, crop) in cases.items():
        rates, both = [], []
        for _ in range(3):
            t = time.perf_counter()
            decoded = [decode({"id": i, "jpg": d}) for i, d in enumerate(data)]
            mid = time.perf_counter()
            for s in decoded:
                crop(s)
            end = time.perf_counter()
            rates.append(len(data) / (mid - t))
            both.append(len(data) / (end - t))
        print(f"{name:<32} {statistics.median(rates):>13,.0f} {statistics.median(both):>13,.0f}")
    if jpeg.available():  # decode -> crop as one call: only the crop is decoded
        fused = Chain([("map", DecodeImage("jpg")), ("map", by_opencv)])
        both = []
        for _ in range(3):
            t = time.perf_counter()
            for i, d in enumerate(data):
                fused({"id": i, "jpg": d})
            both.append(len(data) / (time.perf_counter() - t))
        print(
            f"{'region decode (zephon._jpeg) / opencv':<32} {'-':>13} "
            f"{statistics.median(both):>13,.0f}"
        )
    crop = np.ascontiguousarray(
        np.random.default_rng(0).integers(0, 255, (224, 224, 3), dtype=np.uint8)
    )
    strided = (
        min(
            timeit.repeat(
                lambda: np.ascontiguousarray(crop.transpose(2, 0, 1)), number=2000, repeat=3
            )
        )
        / 2000
    )
    to_chw = ToCHW("jpg")
    split = min(timeit.repeat(lambda: to_chw({"jpg": crop}), number=2000, repeat=3)) / 2000
    print(
        f"to_chw of a 224 x 224 x 3 crop: {split * 1e6:.0f} us (numpy's strided copy of the "
        f"transpose: {strided * 1e6:.0f} us)"
    )


PEER_ROWS = [  # label, venv (None: ours), system, prefix, extra environment
    ("Zephon, tars + persistent index", None, "zephon", "wds",
     {"PEER_FORMAT": "webdataset", "PEER_INDEX": "s3://images/indexes/wds.json"}),
    ("Zephon, tars (no index)", None, "zephon", "wds", {"PEER_FORMAT": "webdataset"}),
    ("Zephon, LitData's chunks", None, "zephon", "litdata", {}),
    ("Zephon, LitData's chunks + index", None, "zephon", "litdata",
     {"PEER_INDEX": "s3://images/indexes/litdata.json"}),
    ("Zephon, Parquet", None, "zephon", "parquet", {}),
    ("LitData 0.2.76", "litdata", "litdata", "litdata", {}),
    ("WebDataset 1.0.2 (http)", "webdataset", "webdataset", "wds", {}),
    ("MosaicML Streaming 0.13.0", "mosaic", "mosaic", "mds", {}),
]  # fmt: skip


def prepare_peers(endpoint: Any, work: Path, data: list[bytes]) -> dict[str, int]:
    """Each system's format written by its own writer and uploaded; the bytes of each."""
    import peers

    client = endpoint.client()
    client.create_bucket(Bucket="images")
    folder = work / "jpegs"
    folder.mkdir()
    for i, body in enumerate(data):
        (folder / f"{i:08d}.jpg").write_bytes(body)
    sizes = {}
    for peer, prefix in (("webdataset", "wds"), ("litdata", "litdata"), ("mosaic", "mds")):
        out = work / prefix
        out.mkdir()
        subprocess.run(
            [
                peers.peer_python(peer),
                str(Path(__file__).parent / "peer_images.py"),
                "write",
                peer,
                str(folder),
                str(out),
            ],
            check=True,
            capture_output=True,
        )
        total = 0
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            client.upload_file(str(path), "images", f"{prefix}/{path.relative_to(out)}")
            total += path.stat().st_size
        sizes[prefix] = total
        shutil.rmtree(out)  # the disk holds one copy at a time
    shutil.rmtree(folder)
    sizes["parquet"] = write_parquet(client, data)
    tars = Dataset.from_path(
        "imgs",
        "s3://images/wds/",
        format="webdataset",
        storage_options=endpoint.storage_options(),
        index_cache=False,
    )
    asyncio.run(tars.awrite_index("s3://images/indexes/wds.json"))
    chunks = Dataset.from_path(
        "imgs",
        "s3://images/litdata/",
        index_cache=False,
        storage_options=endpoint.storage_options(),
    )
    asyncio.run(chunks.awrite_index("s3://images/indexes/litdata.json"))
    return sizes


def write_parquet(client: Any, data: list[bytes], per_file: int = 1000) -> int:
    """The JPEGs with their ids as Parquet files (row groups of 256), uploaded; their bytes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    total = 0
    for at in range(0, len(data), per_file):
        part = data[at : at + per_file]
        table = pa.table(
            {"id": list(range(at, at + len(part))), "jpg": pa.array(part, pa.binary())}
        )
        sink = io.BytesIO()
        pq.write_table(table, sink, row_group_size=256)
        body = sink.getvalue()
        client.put_object(
            Bucket="images", Key=f"parquet/part-{at // per_file:05d}.parquet", Body=body
        )
        total += len(body)
    return total


def part3(
    n: int, rounds: int, only: list[str] | None = None, workers: tuple[int, ...] = (2,)
) -> None:
    import peers

    chosen = [r for r in PEER_ROWS if only is None or any(r[0].startswith(o) for o in only)]

    data = jpegs(n)
    bares = []  # the bare loop runs in each round too: one run of it alone varied 833-1,318
    work = Path(tempfile.mkdtemp(prefix="zephon-images-"))
    try:
        with MotoServer() as endpoint:
            sizes = prepare_peers(endpoint, work, data)
            proxy = ProxyProcess(endpoint.endpoint_url, 0.03)
            proxy.start()
            runner = Path(__file__).parent / "peer_images.py"
            try:
                rows = [peers.with_presigned(r, endpoint, proxy.url, "images") for r in chosen]
                for w in workers:
                    runs: dict[str, list[dict[str, Any]]] = {r[0]: [] for r in chosen}
                    for _ in range(rounds):  # rounds interleave the systems
                        bares.append(bare_rate(data))
                        for row in rows:
                            runs[row[0]].append(
                                peers.run_one(row, proxy, endpoint, w, work, runner, "images")
                            )
                    results = {label: peers.median_run(v) for label, v in runs.items()}
                    peer_table(results, sizes, n, statistics.median(bares), rounds, w)
            finally:
                proxy.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def peer_table(
    results: dict[str, dict[str, Any]],
    sizes: dict[str, int],
    n: int,
    bare: float,
    rounds: int,
    workers: int = 2,
) -> None:
    """The part 3 table: one row per system, ratios to the best peer and the bare loop."""

    def rate(r: dict[str, Any]) -> float:
        return r["samples"] / r["wall_s"] if "error" not in r else 0.0

    rows = [r for r in PEER_ROWS if r[0] in results]
    best = max((rate(results[r[0]]) for r in rows if r[1] is not None), default=0.0)
    peer = f"best peer {best:,.0f} images/s" if best else "no peer run"
    print(
        f"\n# 3. {n:,} JPEGs at +30 ms: decode -> random-resized-crop 224 -> flip -> batch "
        f"256, {f'{workers} worker processes' if workers else 'main process'}, median of "
        f"{rounds}, load {os.getloadavg()[0]:.1f}; bare 2-process loop {bare:,.0f} "
        f"images/s; {peer}"
    )
    print(
        f"{'system':<34} {'images/s':>9} {'x best peer':>11} {'x bare':>7} {'import':>7} "
        f"{'first':>7} {'RSS MB':>7} {'disk MB':>8} {'requests':>8} "
        f"{'MB fetched':>15}"
    )
    for label, _, _, prefix, _ in rows:
        r = results[label]
        if "error" in r:
            print(f"{label:<34} failed: {r['error'].strip().splitlines()[-1][:90]}")
            continue
        ok = r["samples"] == n and r["id_sum"] == n * (n - 1) // 2
        data = sizes[prefix] / 1e6
        fetched = f"{r['bytes'] / 1e6:.0f} ({r['bytes'] / 1e6 / data:.2f}x)"
        flags = "" if ok else f"  WRONG: {r['samples']} images"
        flags += f"  ({r['failed']} of the runs failed)" if r.get("failed") else ""
        to_best = f"{rate(r) / best:>10.2f}x" if best else f"{'-':>11}"  # --only: no peer
        print(
            f"{label:<34} {rate(r):>9,.0f} {to_best} {rate(r) / bare:>6.2f}x "
            f"{r.get('import_s', 0.0):>6.2f}s {r['first_s']:>6.2f}s {r['peak_rss_mb']:>7.0f} "
            f"{r['disk_mb']:>8.0f} {r['requests']:>8} {fetched:>15}{flags}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--peers", action="store_true", help="part 3 only")
    parser.add_argument("--images", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--only", nargs="*", default=None, help="part 3: labels' first words")
    parser.add_argument(
        "--workers", type=int, nargs="*", default=[2], help="part 3: 0 is the main process"
    )
    args = parser.parse_args()
    if args.peers:
        import peers

        peers.compile_zephon()
        part3(args.images, args.rounds, args.only, tuple(args.workers))
        return
    part1()
    pipeline_vs_bare(4000)


if __name__ == "__main__":
    main()

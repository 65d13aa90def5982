"""Image decoding and augmentation: which decoder, what draft mode saves, and the pipeline
against a bare loop.

1. 400 synthetic JPEGs of 300-500 px (quality 85), decoded and random-resized-cropped to 224
   by: Pillow; libjpeg-turbo through ``simplejpeg``; both with DCT draft scaling
   (``max_size=224``). Images/s in one process, median of 3.
2. 4,000 such JPEGs with labels in WebDataset tars on the local S3 server (moto) behind a
   latency proxy (+30 ms): Zephon (decode_image + random_resized_crop(224) + flip + to_chw +
   batch(256), ``processes=2``) against a bare loop doing the same decode and crop on the
   same bytes held in memory by a pool of 2 processes. Images/s over one epoch, first batch,
   bytes fetched.

    .venv/bin/python benchmarks/images.py
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import statistics
import tarfile
import time

import numpy as np
from PIL import Image

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops.image import DecodeImage, Flip, RandomResizedCrop
from zephon.testing import MotoServer, ProxyProcess

DECODE = DecodeImage("jpg")
CROP = RandomResizedCrop(224, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
FLIP = Flip("jpg", 0.5, seed=0)


def bare(item: tuple[int, bytes]) -> int:
    """The bare loop's work for one image: decode, crop, flip (as the pipeline does)."""
    sample = FLIP(CROP(DECODE({"id": item[0], "jpg": item[1]})))
    return int(sample["jpg"].shape[0])


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
    with mp.get_context("forkserver").Pool(2) as pool:
        pool.map(bare, list(enumerate(data[:8])))  # warm the workers
        t = time.perf_counter()
        done = pool.map(bare, list(enumerate(data)), chunksize=16)
        bare_rate = len(done) / (time.perf_counter() - t)
    with MotoServer() as endpoint:
        endpoint.create_bucket("img")
        for s, body in enumerate(tars(data, 8)):
            endpoint.client().put_object(Bucket="img", Key=f"wds/part-{s:03d}.tar", Body=body)
        proxy = ProxyProcess(endpoint.endpoint_url, 0.03)
        url = proxy.start()
        try:
            os.environ.update({"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": endpoint.key,
                               "AWS_SECRET_ACCESS_KEY": endpoint.secret,
                               "AWS_DEFAULT_REGION": "us-east-1"})  # fmt: skip
            t = time.perf_counter()
            ds = Dataset.from_path("imgs", "s3://img/wds/", index_cache=False)
            ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
            pipe = (Pipeline(ws, rank=0, world_size=1).decode_image("jpg", processes=2)
                    .random_resized_crop(224).flip().to_chw().batch(256))  # fmt: skip
            first, images = None, 0
            for batch in pipe:
                first = first if first is not None else time.perf_counter() - t
                images += len(batch["jpg"])
            wall = time.perf_counter() - t
            fetched = proxy.served()["bytes"]
        finally:
            proxy.stop()
    rate = images / wall
    print(f"\n# 2. {n:,} JPEGs ({size / 1e6:.0f} MB) in WebDataset tars at +30 ms: "
          "decode + random_resized_crop(224) + flip, 2 processes")  # fmt: skip
    print(f"bare loop (2 processes, bytes in memory): {bare_rate:,.0f} images/s")
    print(f"Zephon (processes=2, batch 256):          {rate:,.0f} images/s "
          f"({rate / bare_rate:.2f}x the bare loop; target >= 0.9x), first batch {first:.2f} s, "
          f"{fetched / 1e6:.0f} MB fetched ({fetched / size:.2f}x the data)")  # fmt: skip


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


def main() -> None:
    data = jpegs(400)
    crop = RandomResizedCrop(224, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
    cases = {
        "pillow": DecodeImage("jpg", backend="pillow"),
        "pillow, draft 224": DecodeImage("jpg", backend="pillow", max_size=224),
        "simplejpeg": DecodeImage("jpg", backend="simplejpeg"),
        "simplejpeg, draft 224": DecodeImage("jpg", backend="simplejpeg", max_size=224),
    }
    print(f"# {len(data)} JPEGs of 300-500 px: decode -> random_resized_crop(224), one process")
    print(f"{'decoder':<24} {'decode img/s':>13} {'+ crop img/s':>13}")
    for name, decode in cases.items():
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
        print(f"{name:<24} {statistics.median(rates):>13,.0f} {statistics.median(both):>13,.0f}")
    pipeline_vs_bare(4000)


if __name__ == "__main__":
    main()

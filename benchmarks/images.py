"""Image decoding and augmentation: which decoder, and what draft mode saves.

Part 1 (this script so far): 400 synthetic JPEGs of 300-500 px (quality 85), decoded and
random-resized-cropped to 224 by: Pillow; libjpeg-turbo through ``simplejpeg``; both with DCT
draft scaling (``max_size=224``). Images/s in one process, median of 3.

    .venv/bin/python benchmarks/images.py
"""

from __future__ import annotations

import io
import statistics
import time

import numpy as np
from PIL import Image

from zephon.ops.image import DecodeImage, RandomResizedCrop


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


if __name__ == "__main__":
    main()

"""Text-image pairs from WebDataset tars: decode, augment, batch, checkpoint and resume.

Writes a tiny WebDataset (JPEGs of varied sizes with captions) to a temporary directory, then
streams it: decode_image -> random_resized_crop(64) -> flip -> to_chw (in 2 worker processes,
one call per piece of a block) -> batch(8). Each batch
is one contiguous uint8 NCHW array and a list of captions. Half-way through, the pipeline's
checkpoint is taken; a new pipeline restored from it yields exactly the rest.

    python examples/image_text_pairs.py
"""

from __future__ import annotations

import io
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def write_shards(root: Path, shards: int = 2, per_shard: int = 24) -> None:
    rng = np.random.default_rng(0)
    for s in range(shards):
        with tarfile.open(root / f"pairs-{s:04d}.tar", "w") as tar:
            for i in range(s * per_shard, (s + 1) * per_shard):
                h, w = int(rng.integers(80, 140)), int(rng.integers(80, 140))
                pixels = rng.integers(0, 255, (h, w, 3), dtype=np.uint8)
                jpeg = io.BytesIO()
                Image.fromarray(pixels).save(jpeg, format="JPEG", quality=85)
                for ext, data in (("jpg", jpeg.getvalue()), ("txt", f"picture {i}".encode())):
                    info = tarfile.TarInfo(f"{i:06d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))


def build(ds: Dataset) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    return (
        Pipeline(ws, rank=0, world_size=1)
        .decode_image("jpg", max_size=64, processes=2)  # 2 workers; JPEG draft mode
        .random_resized_crop(64, seed=0)  # keyed by the sample: resumes exactly
        .flip(seed=0)  # these run in the same worker call as decode:
        .to_chw()  # only the 64 px crop comes back
        .batch(8)
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write_shards(root)
        ds = Dataset.from_path("pairs", str(root))
        pipe = build(ds)
        batches = []
        state = None
        for n, batch in enumerate(pipe):
            captions = [t.decode() for t in batch["txt"]]
            print(
                f"batch {n}: images {batch['jpg'].shape} {batch['jpg'].dtype}, "
                f"first caption {captions[0]!r}"
            )
            batches.append(batch["jpg"])
            if n == 2:
                state = pipe.checkpoint()
        again = build(ds)
        again.restore(state)
        rest = [b["jpg"] for b in again]
        assert all(np.array_equal(a, b) for a, b in zip(batches[3:], rest, strict=True))
        assert len(rest) == len(batches) - 3
        print(f"{len(batches)} batches; resumed exactly after batch 2")


if __name__ == "__main__":
    main()

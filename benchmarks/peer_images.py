"""One system's side of ``benchmarks/images.py --peers``: write its format from a folder of
JPEGs, or read one shuffled epoch of images doing decode -> random-resized-crop 224 -> flip ->
batches of 256 uint8 arrays with 2 worker processes.

Runs inside the system's own virtual environment (standard library, numpy and Pillow at the
top; the system's library inside each function). Peers decode with Pillow and crop with
Pillow's resize over the crop box (the fast form of torchvision's ``RandomResizedCrop``, which
needs a torchvision built for the pinned torch); Zephon uses its own image steps. Prints one
JSON line like ``peer_run.py``: ``import_s`` (the system's modules, before the clock starts),
``first_s`` (from building the dataset to the first batch), ``wall_s``, ``samples``,
``id_sum``, ``peak_rss_mb``, ``disk_mb``.

    python benchmarks/peer_images.py write SYSTEM JPEG_DIR OUT_DIR
    python benchmarks/peer_images.py read SYSTEM URL CACHE_DIR WORKERS
"""

from __future__ import annotations

import importlib
import io
import json
import math
import os
import random
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from peer_run import IMPORTS as TEXT_IMPORTS
from peer_run import TreeUsage, _without_torchvision, cli, disk_bytes

BATCH, SIZE = 256, 224
# Imported before the clock starts, as in peer_run.py (Zephon's image reader needs no torch).
IMPORTS = {**TEXT_IMPORTS, "zephon": [m for m in TEXT_IMPORTS["zephon"] if m != "torch.utils.data"]}


def images(jpeg_dir: str) -> Iterator[tuple[int, bytes]]:
    """``(label id, JPEG bytes)`` of the folder's ``<id>.jpg`` files, in id order."""
    for path in sorted(Path(jpeg_dir).glob("*.jpg")):
        yield int(path.stem), path.read_bytes()


# -- writers: each peer's own -------------------------------------------------------------


def write_litdata(jpeg_dir: str, out: str) -> None:
    import litdata

    litdata.optimize(
        fn=_litdata_sample,
        inputs=sorted(Path(jpeg_dir).glob("*.jpg")),
        output_dir=out,
        chunk_bytes="32MB",
        num_workers=1,
        mode="overwrite",
    )


def _litdata_sample(path: Path) -> dict[str, Any]:
    # JPEG bytes as bytes: LitData's own JPEG serializer decodes through torchvision.
    return {"id": int(path.stem), "jpg": path.read_bytes()}


def write_mds(jpeg_dir: str, out: str) -> None:
    _without_torchvision()
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"id": "int64", "jpg": "bytes"}, size_limit=1 << 25) as w:
        for i, data in images(jpeg_dir):
            w.write({"id": i, "jpg": data})


def write_webdataset(jpeg_dir: str, out: str) -> None:
    import webdataset as wds

    everything = list(images(jpeg_dir))
    per = -(-len(everything) // 16)
    for s in range(16):
        with wds.TarWriter(f"{out}/shard-{s:06d}.tar") as w:
            for i, data in everything[s * per : (s + 1) * per]:
                w.write({"__key__": f"{i:08d}", "jpg": data, "cls": str(i % 1000).encode()})


WRITERS = {"litdata": write_litdata, "mosaic": write_mds, "webdataset": write_webdataset}


# -- the peers' augmentation ---------------------------------------------------------------


def augment(data: bytes, seed: int) -> np.ndarray:
    """Pillow decode, a random-resized crop to 224 (scale 0.08-1, ratio 3/4-4/3) and a
    horizontal flip with probability 1/2, as torchvision draws them."""
    rng = random.Random(seed)
    img = Image.open(io.BytesIO(data)).convert("RGB")
    w, h = img.size
    box = None
    for _ in range(10):
        target = w * h * rng.uniform(0.08, 1.0)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        cw, ch = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < cw <= w and 0 < ch <= h:
            top, left = rng.randint(0, h - ch), rng.randint(0, w - cw)
            box = (left, top, left + cw, top + ch)
            break
    img = img.resize((SIZE, SIZE), Image.Resampling.BILINEAR, box=box)
    if rng.random() < 0.5:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img)


def collate(samples: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    return {"id": [i for i, _ in samples], "jpg": np.stack([x for _, x in samples])}


# -- readers ------------------------------------------------------------------------------


def read_zephon(url: str, workers: int) -> Iterable[Any]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    ds = Dataset.from_path(
        "imgs",
        url,
        format=os.environ.get("PEER_FORMAT") or None,
        index=os.environ.get("PEER_INDEX") or None,
    )
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    cache = (
        {"range_cache_bytes": int(os.environ["PEER_RANGE_CACHE"])}
        if "PEER_RANGE_CACHE" in os.environ
        else {}
    )
    if "PEER_FETCH_BUDGET" in os.environ:
        cache["fetch_budget_bytes"] = int(os.environ["PEER_FETCH_BUDGET"])
    return (
        Pipeline(ws, rank=0, world_size=1, **cache)
        .decode_image("jpg", processes=workers)
        .random_resized_crop(SIZE)
        .flip()
        .batch(BATCH)
    )


def read_litdata(url: str, workers: int) -> Iterable[Any]:
    import litdata.streaming.downloader as downloader
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.resolver import Dir

    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

    class Images(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: Any) -> tuple[int, np.ndarray]:
            sample = super().__getitem__(index)
            return int(sample["id"]), augment(sample["jpg"], int(sample["id"]))

    ds = Images(Dir(path=os.environ["PEER_CACHE"], url=url), shuffle=True, seed=0)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate)


def read_mosaic(url: str, workers: int) -> Iterable[Any]:
    _without_torchvision()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory
    from torch.utils.data import DataLoader

    clean_stale_shared_memory()

    class Images(StreamingDataset):  # type: ignore[misc]
        def __getitem__(self, index: int) -> tuple[int, np.ndarray]:
            sample = super().__getitem__(index)
            return int(sample["id"]), augment(sample["jpg"], int(sample["id"]))

    ds = Images(
        remote=url, local=os.environ["PEER_CACHE"], shuffle=True, shuffle_seed=0, batch_size=BATCH
    )
    return DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate)


def _wds_sample(sample: dict[str, Any]) -> tuple[int, np.ndarray]:
    i = int(sample["__key__"])
    return i, augment(sample["jpg"], i)


def read_webdataset(url: str, workers: int) -> Iterable[Any]:
    import webdataset as wds

    urls = json.loads(os.environ["PEER_URLS"])  # presigned: the bucket is private
    ds = (
        wds.WebDataset(urls, shardshuffle=16, seed=0, empty_check=False, nodesplitter=None)
        .shuffle(1000)
        .map(_wds_sample)
        .batched(BATCH, collation_fn=collate)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)


READERS = {"zephon": read_zephon, "litdata": read_litdata, "mosaic": read_mosaic,
           "webdataset": read_webdataset}  # fmt: skip


def read(system: str, url: str, cache: str, workers: int) -> dict[str, Any]:
    os.environ["PEER_CACHE"] = cache
    if system == "mosaic":
        _without_torchvision()
    began = time.perf_counter()
    for module in IMPORTS[system]:
        importlib.import_module(module)
    imported = time.perf_counter() - began
    with TreeUsage() as rss:
        started = time.perf_counter()
        first = None
        samples = id_sum = 0
        for batch in READERS[system](url, workers):
            if first is None:
                first = time.perf_counter() - started
            ids = batch["id"] if "id" in batch else batch["__key__"]  # tars: the key is the id
            ids = ids.tolist() if hasattr(ids, "tolist") else ids
            assert len(batch["jpg"]) == len(ids) and tuple(batch["jpg"].shape[1:]) in (
                (SIZE, SIZE, 3),
                (3, SIZE, SIZE),
            )
            samples += len(ids)
            id_sum += sum(int(i) for i in ids)
        wall = time.perf_counter() - started
    return {
        "import_s": imported,
        "first_s": first,
        "wall_s": wall,
        "samples": samples,
        "id_sum": id_sum,
        "peak_rss_mb": rss.peak / 2**20,
        "disk_mb": disk_bytes(cache) / 2**20,
    }


if __name__ == "__main__":
    cli(read, WRITERS)

"""One peer's side of ``benchmarks/peers.py``: write its format, or read one shuffled epoch.

Runs inside the peer's own virtual environment, so it imports nothing but the standard library
at the top (and the peer's library inside each function). Every reader measures the same
things and prints one JSON line:

- ``import_s``: importing the library and what it reads S3 with (torch's DataLoader too);
- ``first_s``: from building the dataset object to the first sample (imports excluded);
- ``wall_s``: the whole epoch, start-up included; ``samples``, and ``id_sum`` (every sample
  exactly once: the sum of their ids);
- ``peak_rss_mb``: the largest sum of resident memory over this process and its children,
  sampled every 20 ms;
- ``cpu_main_s``, ``cpu_all_s``: CPU seconds of the epoch spent by this (the trainer's)
  process, and by it and all its children (workers, helper processes);
- ``disk_mb``: what the peer left in its local cache directory.

    python benchmarks/peer_run.py read SYSTEM URL CACHE_DIR WORKERS
    python benchmarks/peer_run.py write SYSTEM DOCS_DIR OUT_DIR
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

BATCH = 64  # samples per batch when workers hand batches to the main process


def docs(docs_dir: str) -> Iterator[dict[str, Any]]:
    for path in sorted(Path(docs_dir).glob("*.jsonl")):
        with path.open() as f:
            for line in f:
                yield json.loads(line)


# -- writers: each peer's own -------------------------------------------------------------


def _without_torchvision() -> None:
    """``import streaming`` imports its vision datasets, hence torchvision, which PyPI only has
    for other torch releases than the pinned one. Text never touches them: stand-ins let the
    package import."""
    import importlib.machinery
    import types

    if "torchvision" in sys.modules:
        return
    stand_in = types.ModuleType("torchvision")
    datasets = types.ModuleType("torchvision.datasets")
    transforms = types.ModuleType("torchvision.transforms")
    functional = types.ModuleType("torchvision.transforms.functional")
    datasets.VisionDataset = type("VisionDataset", (), {})  # type: ignore[attr-defined]
    datasets.CIFAR10 = datasets.VisionDataset  # type: ignore[attr-defined]
    functional.to_tensor = None  # type: ignore[attr-defined]
    for module in (stand_in, datasets, transforms, functional):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
        sys.modules[module.__name__] = module


def write_mds(docs_dir: str, out: str) -> None:
    _without_torchvision()
    from streaming import MDSWriter

    with MDSWriter(out=out, columns={"id": "int64", "text": "str"}, size_limit=1 << 23) as w:
        for doc in docs(docs_dir):
            w.write(doc)


def _identity(doc: dict[str, Any]) -> dict[str, Any]:
    return doc


def write_litdata(docs_dir: str, out: str) -> None:
    import litdata

    litdata.optimize(
        fn=_identity,
        inputs=list(docs(docs_dir)),
        output_dir=out,
        chunk_bytes="8MB",
        num_workers=1,
        mode="overwrite",
    )


def write_webdataset(docs_dir: str, out: str) -> None:
    import webdataset as wds

    everything = list(docs(docs_dir))
    per = -(-len(everything) // 16)
    for s in range(16):
        with wds.TarWriter(f"{out}/shard-{s:06d}.tar") as w:
            for doc in everything[s * per : (s + 1) * per]:
                w.write({"__key__": f"{doc['id']:08d}", "json": json.dumps(doc).encode()})


# -- readers ------------------------------------------------------------------------------


def _count(item: Any) -> tuple[int, int]:
    """(samples, sum of ids) of a sample or a batch of them, whatever shape a peer gives."""
    if hasattr(item, "payload"):  # the original zephon's SampleRecord
        return _count(item.payload)
    if isinstance(item, list):
        pairs = [_count(x) for x in item]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    if isinstance(item, dict):
        if "json" in item:  # a WebDataset sample, decoded
            return _count(item["json"])
        ids = item.get("id")
        if isinstance(ids, list | tuple):
            return len(ids), sum(int(i) for i in ids)
        if hasattr(ids, "tolist"):
            values = ids.tolist()
            return (len(values), sum(values)) if isinstance(values, list) else (1, int(values))
        return 1, int(ids) if ids is not None else 0
    return 1, 0


def read_zephon(url: str, workers: int) -> Iterable[Any]:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    fmt = os.environ.get("PEER_FORMAT") or None
    ds = Dataset.from_path("web", url, format=fmt, index=os.environ.get("PEER_INDEX") or None)
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    if os.environ.get("PEER_ENGINE") == "process":  # the whole pipeline in a child process
        engine = Pipeline(ws, rank=0, world_size=1, lanes=max(1, workers), engine="process")
        return engine.batch(BATCH)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=max(1, workers))
    if not workers:
        return pipe
    from torch.utils.data import DataLoader

    return DataLoader(pipe.batch(BATCH).to_torch_dataset(), batch_size=None, num_workers=workers)


def read_floor(url: str, workers: int) -> Iterable[Any]:
    """Not a reader: the least any reader of this data through this server needs. Every JSONL
    object under the prefix fetched whole, all at once, and cut into batches of ``BATCH``
    lines that nothing parses (another format's objects are fetched and not looked at: its
    floor); with ``workers``, each DataLoader worker fetches its share and
    its batches cross to the main process as every reader's do."""
    if not workers:
        yield from _floor_batches(url, 0, 1)
        return
    from torch.utils.data import DataLoader, IterableDataset, get_worker_info

    class Floor(IterableDataset[dict[str, Any]]):  # workers fork: never pickled
        def __iter__(self) -> Iterator[dict[str, Any]]:
            info = get_worker_info()
            return _floor_batches(url, info.id, info.num_workers)

    yield from DataLoader(Floor(), batch_size=None, num_workers=workers)


def _floor_batches(url: str, worker: int, workers: int) -> Iterator[dict[str, Any]]:
    import asyncio

    import numpy as np
    from aiobotocore.session import get_session

    bucket, _, prefix = url.removeprefix("s3://").partition("/")

    async def fetch_all() -> list[bytes]:
        endpoint = os.environ["AWS_ENDPOINT_URL"]
        async with get_session().create_client("s3", endpoint_url=endpoint) as client:
            keys = []
            pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
            async for page in pages:
                keys += [o["Key"] for o in page.get("Contents", [])]

            async def whole(key: str) -> bytes:
                response = await client.get_object(Bucket=bucket, Key=key)
                async with response["Body"] as body:
                    return bytes(await body.read())

            return await asyncio.gather(*map(whole, sorted(keys)[worker::workers]))

    objects = asyncio.run(fetch_all())
    if not prefix.startswith("jsonl"):  # another format's bytes: fetched, nothing counted
        share = int(os.environ["PEER_SAMPLES"]) // workers
        yield {"id": np.zeros(share, dtype=np.int64), "text": objects}
        return
    for data in objects:
        lines = data.split(b"\n")[:-1]
        for at in range(0, len(lines), BATCH):
            text = lines[at : at + BATCH]
            yield {"id": np.zeros(len(text), dtype=np.int64), "text": text}  # ids unread


def read_litdata(url: str, workers: int) -> Iterable[Any]:
    import litdata.streaming.downloader as downloader
    from litdata import StreamingDataLoader, StreamingDataset
    from litdata.streaming.resolver import Dir

    # Its fast path (obstore) refuses a plain-http endpoint unless told; real S3 is https.
    downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

    ds = StreamingDataset(Dir(path=os.environ["PEER_CACHE"], url=url), shuffle=True, seed=0)
    if not workers:
        return ds
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list)


def read_mosaic(url: str, workers: int) -> Iterable[Any]:
    _without_torchvision()
    from streaming import StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    clean_stale_shared_memory()
    ds = StreamingDataset(
        remote=url, local=os.environ["PEER_CACHE"], shuffle=True, shuffle_seed=0, batch_size=BATCH
    )
    if not workers:
        return ds
    from torch.utils.data import DataLoader

    return DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list)


def read_webdataset(url: str, workers: int) -> Iterable[Any]:
    import webdataset as wds

    urls = json.loads(os.environ["PEER_URLS"])  # presigned: the bucket is private
    ds = (
        wds.WebDataset(urls, shardshuffle=16, seed=0, empty_check=False, nodesplitter=None)
        .shuffle(1000)
        .decode()
    )
    if not workers:
        return ds
    return wds.WebLoader(ds.batched(BATCH, collation_fn=list), batch_size=None, num_workers=workers)


def read_zephon_original(url: str, workers: int) -> Iterable[Any]:
    from zephon.io import Dataset
    from zephon.work import StaticMixtureWorkSource

    from zephon import Pipeline

    ds = Dataset.from_path("web", url)
    ws = StaticMixtureWorkSource(
        datasets=[ds],
        mixture={"web": 1.0},
        seed=0,
        chunk_size=1000,
        shuffle_within_shard=True,
        stop_after_passes=1,
    )
    cache = {"enabled": True, "root": os.environ["PEER_CACHE"]}  # it reads through a disk cache
    return Pipeline(ws).options(io_options={"cache": cache}).decode_text()


READERS: dict[str, Callable[[str, int], Iterable[Any]]] = {
    "zephon": read_zephon,
    "floor": read_floor,
    "litdata": read_litdata,
    "mosaic": read_mosaic,
    "webdataset": read_webdataset,
    "zephon-0.2.0": read_zephon_original,
}
WRITERS = {"mosaic": write_mds, "litdata": write_litdata, "webdataset": write_webdataset}


class TreeUsage:
    """Peak of the summed resident memory of this process and its descendants, and their CPU
    seconds, sampled every 20 ms (a child's CPU time is its last sample: one that exits
    between two samples loses at most 20 ms). ``main_cpu`` is this process's own, all its
    threads but the sampler's."""

    def __init__(self) -> None:
        self.peak = 0
        self.cpu: dict[int, float] = {}
        self.main_cpu = 0.0
        self._sampler_cpu = 0.0
        self._stop = threading.Event()
        self._page = os.sysconf("SC_PAGE_SIZE")
        self._tick = os.sysconf("SC_CLK_TCK")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> TreeUsage:
        self._began = os.times()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._sample())
        ended = os.times()
        own = (ended.user - self._began.user) + (ended.system - self._began.system)
        self.main_cpu = own - self._sampler_cpu
        # Children waited for are in os.times() too; the larger of the two counts each once.
        reaped = (ended.children_user - self._began.children_user) + (
            ended.children_system - self._began.children_system
        )
        children = sum(cpu for pid, cpu in self.cpu.items() if pid != os.getpid())
        self.all_cpu = self.main_cpu + max(children, reaped)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._sample())
        self._sampler_cpu = time.thread_time()

    def _sample(self) -> int:
        """Cheap enough to run every 20 ms beside the reader: this process's descendants
        from the kernel's per-thread ``children`` lists, not a scan of all of ``/proc``."""
        tree, todo = set(), [os.getpid()]
        while todo:
            pid = todo.pop()
            if pid in tree:
                continue
            tree.add(pid)
            try:
                for task in os.scandir(f"/proc/{pid}/task"):
                    with open(f"{task.path}/children") as f:
                        todo.extend(int(c) for c in f.read().split())
            except OSError:
                continue
        total = 0
        for pid in tree:
            try:
                with open(f"/proc/{pid}/statm") as f:
                    total += int(f.read().split()[1]) * self._page
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
                self.cpu[pid] = (int(fields[11]) + int(fields[12])) / self._tick
            except OSError:
                continue
        return total


def disk_bytes(root: str) -> int:
    total = 0
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                continue
    return total


IMPORTS = {  # imported before the clock starts: start-up is the dataset's, not the import's
    # Zephon's package imports its parts on first use (PEP 562): the reader's are named here.
    "zephon": [
        "zephon.dataset",
        "zephon.pipeline",
        "zephon.plan",
        "zephon.storage.s3",
        "torch.utils.data",
    ],
    "floor": ["aiobotocore.session", "numpy", "torch.utils.data"],
    "litdata": ["litdata"],
    "mosaic": ["streaming"],
    "webdataset": ["webdataset", "torch.utils.data"],
    "zephon-0.2.0": ["zephon", "zephon.io", "zephon.work"],
}


def read(system: str, url: str, cache: str, workers: int) -> dict[str, Any]:
    import importlib

    os.environ["PEER_CACHE"] = cache
    if system == "mosaic":
        _without_torchvision()
    began = time.perf_counter()
    for module in IMPORTS[system]:
        importlib.import_module(module)
    imported = time.perf_counter() - began
    with TreeUsage() as usage:
        started = time.perf_counter()
        first = None
        samples = id_sum = 0
        for item in READERS[system](url, workers):
            if first is None:
                first = time.perf_counter() - started
            n, s = _count(item)
            samples += n
            id_sum += s
        wall = time.perf_counter() - started
    return {
        "import_s": imported,
        "first_s": first,
        "wall_s": wall,
        "samples": samples,
        "id_sum": id_sum,
        "peak_rss_mb": usage.peak / 2**20,
        "cpu_main_s": usage.main_cpu,
        "cpu_all_s": usage.all_cpu,
        "disk_mb": disk_bytes(cache) / 2**20,
    }


def cli(
    read: Callable[[str, str, str, int], dict[str, Any]],
    writers: dict[str, Callable[[str, str], None]],
) -> None:
    """``write SYSTEM IN OUT`` or ``read SYSTEM URL CACHE WORKERS`` (one JSON line)."""
    if sys.argv[1] == "write":
        writers[sys.argv[2]](sys.argv[3], sys.argv[4])
        return
    system, url, cache, workers = sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    print(json.dumps(read(system, url, cache, workers)), flush=True)


if __name__ == "__main__":
    cli(read, WRITERS)

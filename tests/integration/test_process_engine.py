"""engine="process": the pipeline in a child process behaves as in-thread (items, checkpoints,
restore, stats, errors) and leaves nothing behind."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import pipeline_fns as fns
from tests.formatdata import write_jsonl
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, WorkerCrashed

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    root = tmp_path_factory.mktemp("docs")
    write_jsonl(root, shards=4, per_shard=60)
    return Dataset.from_path("docs", str(root))


def build(ds: Dataset, engine: str, fn: Any = fns.as_tokens) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=5, chunk_size=32, stop_after_passes=1)
    return (
        Pipeline(ws, rank=0, world_size=1, lanes=2, engine=engine)
        .map(fn)
        .shuffle(16)
        .pack(16)
        .batch(3)
    )


def rows(batches: list[Any]) -> list[list[list[int]]]:
    return [b["input_ids"].tolist() for b in batches]


def test_items_checkpoints_and_restore_match_the_thread_engine(docs: Dataset) -> None:
    expected = list(build(docs, "thread"))
    pipe = build(docs, "process")
    it = iter(pipe)
    head = [next(it) for _ in range(5)]
    assert isinstance(head[0]["input_ids"], np.ndarray)  # arrays cross through shared memory
    state = pipe.checkpoint()
    stats = pipe.stats()
    assert stats["delivered"] > 0 and "fetch" in stats  # asked of the child while it runs
    tail = list(it)
    assert rows(head + tail) == rows(expected)
    # Its checkpoint is what this consumer received (not what the child prepared ahead), and
    # it restores into either engine.
    threaded = build(docs, "thread")
    threaded.restore(state)
    assert rows(list(threaded)) == rows(tail)
    again = build(docs, "process")
    again.restore(state)
    assert rows(list(again)) == rows(tail)
    assert again.checkpoint()["lane_runs"] == threaded.checkpoint()["lane_runs"]


def test_torch_tensors_and_async_iteration(docs: Dataset) -> None:
    torch = pytest.importorskip("torch")
    expected = rows(list(build(docs, "thread")))
    tensors = list(build(docs, "process").to_torch())
    assert isinstance(tensors[0]["input_ids"], torch.Tensor)
    assert [t["input_ids"].tolist() for t in tensors] == expected

    async def collect() -> list[Any]:
        return [b async for b in build(docs, "process")]

    import asyncio

    assert rows(asyncio.run(collect())) == expected


def test_errors_keep_their_type_and_name_the_sample(docs: Dataset) -> None:
    ws = StaticMixtureWorkSource([docs], seed=5, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, engine="process").map(fns.fail_on_13)
    with pytest.raises(KeyError, match="no luck for 13") as info:
        list(pipe)
    notes = "".join(info.value.__notes__)
    assert "fail_on_13" in notes and "sample" in notes
    assert "raised in the pipeline's process" in notes


def test_a_child_that_dies_is_worker_crashed(docs: Dataset) -> None:
    ws = StaticMixtureWorkSource([docs], seed=5, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, engine="process").map(fns.die_on_7)
    with pytest.raises(WorkerCrashed, match="pipeline's process died"):
        list(pipe)


def test_an_item_that_does_not_unpickle_here_raises_instead_of_hanging(docs: Dataset) -> None:
    ws = StaticMixtureWorkSource([docs], seed=5, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, engine="process").map(fns.with_only_in_child)
    with pytest.raises(ValueError, match="unpickles only in a child"):
        list(pipe)


def test_functions_travel_by_value_and_what_cannot_travel_is_refused(docs: Dataset) -> None:
    tokens = fns.as_tokens
    assert rows(list(build(docs, "process", lambda s: tokens(s)))) == rows(
        list(build(docs, "thread"))
    )
    lock = threading.Lock()
    with pytest.raises(ConfigError, match="must serialise"):
        iter(build(docs, "process", lambda s: (lock, s))).__next__()
    with pytest.raises(ConfigError, match="engine must be"):
        Pipeline(StaticMixtureWorkSource([docs]), engine="fork")


def test_breaking_out_stops_the_child_and_frees_shared_memory(docs: Dataset) -> None:
    before = set(os.listdir("/dev/shm")) if Path("/dev/shm").exists() else set()
    pipe = build(docs, "process")
    for n, _ in enumerate(pipe):
        if n == 2:
            break
    assert multiprocessing.active_children() == []
    if before or Path("/dev/shm").exists():
        assert {n for n in os.listdir("/dev/shm") if n.startswith("zph")} <= before


def test_an_async_wait_that_is_cancelled_loses_no_item(docs: Dataset) -> None:
    """A cancelled ``anext`` (a timeout) while an item is on its way: that item is not counted
    as received, so a checkpoint then resumes exactly (once, the thread taking items raised
    ``generator already executing`` instead)."""
    expected = rows(list(build(docs, "thread")))
    pipe = build(docs, "process")

    async def head() -> list[Any]:
        got: list[Any] = []
        for starting in (True, False, False):  # cancelled while the child starts, then not
            pipe.restore(pipe.checkpoint())
            it = pipe.__aiter__()
            if not starting:
                got.append(await anext(it))
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0):
                    got.append(await anext(it))
        return got

    got = asyncio.run(head())
    rest = build(docs, "process")
    rest.restore(pipe.checkpoint())
    assert rows(got + list(rest)) == expected
    assert multiprocessing.active_children() == []


def test_aclose_and_close_from_another_thread_stop_the_child(docs: Dataset) -> None:
    pipe = build(docs, "process")

    async def run() -> list[Any]:
        it = pipe.__aiter__()
        await anext(it)
        await pipe.aclose()
        return [b async for b in it]  # the iteration ends: the child is gone

    assert asyncio.run(run()) == []
    assert multiprocessing.active_children() == []
    started, errors = threading.Event(), []

    def consume() -> None:
        try:
            for _ in pipe:
                started.set()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=consume)
    thread.start()
    started.wait()
    pipe.close()
    thread.join()
    assert errors == [] and multiprocessing.active_children() == []


def test_the_child_runs_worker_pools_of_its_own(docs: Dataset) -> None:
    def run(engine: str) -> list[list[int]]:
        ws = StaticMixtureWorkSource([docs], seed=2, stop_after_passes=1)
        pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, engine=engine, decode_processes=2)
        return [b["double"].tolist() for b in pipe.map(fns.double, processes=2).batch(7)]

    assert run("process") == run("thread")


def test_inside_a_dataloader_worker_it_says_to_use_the_thread_engine(docs: Dataset) -> None:
    torch = pytest.importorskip("torch")
    ws = StaticMixtureWorkSource([docs], seed=2, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, engine="process").batch(4)
    loader = torch.utils.data.DataLoader(
        pipe.to_torch_dataset(),
        batch_size=None,
        num_workers=2,
        multiprocessing_context="forkserver",
    )
    with pytest.raises(ConfigError, match="engine='thread' there"):
        next(iter(loader))


def _mapped_segments() -> set[str]:
    """The shared-memory segments this process has mapped (Linux)."""
    lines = Path("/proc/self/maps").read_text().splitlines()
    return {line.split(maxsplit=5)[5].split()[0] for line in lines if "/dev/shm/zph" in line}


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
def test_slots_that_grow_leave_no_old_segment_mapped_here(tmp_path: Path) -> None:
    """Each item outgrows the slot it lands in, so the child replaces the slot's segment;
    the parent unmaps the old one instead of holding every size a slot ever had."""
    (tmp_path / "part-0.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(16)))
    ds = Dataset.from_path("grown", str(tmp_path), index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="none", stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=1, engine="process").map(fns.grown)
    before = _mapped_segments()
    most = 0
    for i, item in enumerate(pipe):
        assert item["id"] == i and len(item["x"]) == (i + 4) << 18 and item["x"][-1] == i
        most = max(most, len(_mapped_segments() - before))
    assert most <= 4  # one per slot
    assert not _mapped_segments() - before  # all unmapped once the run is over


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="reads /proc/self/maps")
@pytest.mark.parametrize(("nbytes", "through_slots"), [(512, False), (1 << 16, True)])
def test_small_arrays_cross_pickled_and_large_ones_through_shared_memory(
    tmp_path: Path, nbytes: int, through_slots: bool
) -> None:
    """A batch of ids (512 bytes) travels pickled with the rest of its item: a slot round
    trip (a write there, a copy and a message back here) cost the trainer twice the CPU of
    a text epoch. Arrays from 64 KiB go through a slot; both arrive equal and writable."""
    (tmp_path / "part-0.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(8)))
    ds = Dataset.from_path("sized", str(tmp_path), index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="none", stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=1, engine="process").map(fns.Filled(nbytes))
    before = _mapped_segments()
    mapped = False
    for i, item in enumerate(pipe):
        x = item["x"]
        assert x.nbytes == nbytes and x[0] == x[-1] == i and x.flags.writeable
        mapped = mapped or bool(_mapped_segments() - before)
    assert i == 7 and mapped is through_slots

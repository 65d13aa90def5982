"""Worker results come back through shared memory: equal values, writable arrays of their
own; segments are used again once given back (received, cancelled), never stay busy, and none
outlives its pool (shut down, or its worker killed)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests import pipeline_fns
from zephon.engine import shm
from zephon.engine.pool import WorkerPool
from zephon.errors import WorkerCrashed

pytestmark = pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")


@pytest.fixture
def pools() -> Iterator[Callable[[int], WorkerPool]]:
    """``pools(n)``: a pool of ``n`` workers, shut down after the test."""
    made: list[WorkerPool] = []

    def make(processes: int) -> WorkerPool:
        made.append(WorkerPool(processes))
        return made[-1]

    yield make
    for pool in made:
        pool.shutdown()


@pytest.fixture(autouse=True)
def _swept() -> Iterator[None]:
    """The kept segments of this module's own prefixes go with each test."""
    yield
    for prefix in ("zphtest_", "zphfull_"):
        shm.sweep(prefix)


def _segments(prefix: str) -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]


def _busy(prefix: str) -> list[str]:
    """Segments of ``prefix`` not given back (a kept segment's first byte says so)."""
    return [n for n in _segments(prefix) if Path("/dev/shm", n).read_bytes()[:1] != b"\0"]


def _assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got.keys() == want.keys()
    for key in ("images", "floats", "strided", "small"):
        for a, b in zip(np.atleast_1d(got[key]), np.atleast_1d(want[key]), strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    assert got["floats"].flags.f_contiguous
    assert got["table"].equals(want["table"])
    assert (got["text"], got["seed"]) == (want["text"], want["seed"])


def test_large_arrays_go_through_a_segment_given_back_once_received_and_used_again() -> None:
    packed = shm.pack(pipeline_fns.arrays(0), "zphtest_")
    assert packed.name is not None and not packed.inline and packed.kept
    assert _busy("zphtest_") == [packed.name]
    assert len(packed.data) < 250_000  # only the strided view (214 KB) went in the pickle
    got = shm.unpack(packed)
    assert _busy("zphtest_") == [] and _segments("zphtest_") == [packed.name]
    _assert_same(got, pipeline_fns.arrays(0))
    again = shm.pack(pipeline_fns.arrays(1), "zphtest_")
    assert again.name == packed.name  # the same pages, no new segment
    _assert_same(shm.unpack(again), pipeline_fns.arrays(1))
    _assert_same(got, pipeline_fns.arrays(0))  # the first result owns its arrays
    held = [shm.pack(pipeline_fns.arrays(s), "zphtest_") for s in range(shm.KEEP + 2)]
    assert len({p.name for p in held}) == shm.KEEP + 2  # none given back: each its own
    assert sum(p.kept for p in held) == shm.KEEP  # past those kept, used once
    for seed, p in enumerate(held):
        _assert_same(shm.unpack(p), pipeline_fns.arrays(seed))
    assert len(_segments("zphtest_")) == shm.KEEP and _busy("zphtest_") == []
    shm.sweep("zphtest_")
    assert _segments("zphtest_") == []


async def test_results_of_workers_are_equal_and_own_their_arrays(
    pools: Callable[[int], WorkerPool],
) -> None:
    pool = pools(2)
    results = await asyncio.gather(*(pool.run("s", pipeline_fns.arrays, s) for s in range(6)))
    for seed, got in enumerate(results):
        _assert_same(got, pipeline_fns.arrays(seed))
        first, second = got["images"]
        # Each array is its own memory (an item held on to holds only itself), writable.
        assert not np.shares_memory(first, second)
        assert not np.shares_memory(first, results[seed - 1]["images"][0])
        first[0, 0] = 7
    assert _busy(pool.segment_prefix) == []  # each given back on receipt
    assert len(_segments(pool.segment_prefix)) <= 2 * shm.KEEP  # kept by each worker
    pool.shutdown()
    assert _segments(pool.segment_prefix) == []


async def test_a_cancelled_call_leaves_no_segment(pools: Callable[[int], WorkerPool]) -> None:
    pool = pools(1)
    task = asyncio.ensure_future(pool.run("s", pipeline_fns.arrays, 1))
    await asyncio.sleep(0)  # submitted
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # One worker takes calls in order: when this one is back, the cancelled one (if it
    # ran at all) has been received and unlinked.
    got = await pool.run("s", pipeline_fns.arrays, 2)
    _assert_same(got, pipeline_fns.arrays(2))
    assert _busy(pool.segment_prefix) == []


async def test_a_segment_whose_worker_died_is_swept_at_shutdown() -> None:
    pool = WorkerPool(1)
    with pytest.raises(WorkerCrashed):
        await pool.run("s", pipeline_fns.pack_then_exit, pool.segment_prefix)
    assert len(_segments(pool.segment_prefix)) == 1  # written, never sent
    pool.shutdown()
    assert _segments(pool.segment_prefix) == []


def test_results_go_inline_when_shared_memory_is_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm, "_room_for", lambda size: False)
    packed = shm.pack(pipeline_fns.arrays(3), "zphtest_")
    assert packed.name is None and packed.inline  # the arrays travel beside the pickle
    got = shm.unpack(packed)
    _assert_same(got, pipeline_fns.arrays(3))
    got["images"][1][0, 0] = 1  # still writable


def test_a_small_result_makes_no_segment() -> None:
    packed = shm.pack({"ids": np.arange(1000), "table": pa.array(range(100))}, "zphtest_")
    assert packed.name is None and not packed.inline
    assert shm.unpack(packed)["ids"].sum() == 499_500


def test_a_process_that_exits_leaves_no_segment_and_no_warning(tmp_path: Path) -> None:
    script = tmp_path / "run.py"
    script.write_text(
        "import asyncio\n"
        "from tests import pipeline_fns\n"
        "from zephon.engine.pool import WorkerPool\n"
        "async def main():\n"
        "    pool = WorkerPool(2)\n"
        "    await asyncio.gather(*(pool.run('s', pipeline_fns.arrays, s) for s in range(4)))\n"
        "    print(pool.segment_prefix)\n"
        "    pool.shutdown()\n"
        "if __name__ == '__main__':\n"
        "    asyncio.run(main())\n"
    )
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, cwd=root, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "leaked" not in done.stderr and "resource_tracker" not in done.stderr
    assert _segments(done.stdout.strip()) == []


def _blobs(n: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(n)
    return [
        {
            "jpg": rng.bytes(100_000 + i),
            "hf": {"bytes": rng.bytes(70_000), "path": None},
            "cls": b"7",
            "id": i,
        }
        for i in range(n)
    ]


def _expected(items: list[dict[str, Any]]) -> list[tuple[str, int, str]]:
    return pipeline_fns.describe(items)


async def test_large_bytes_reach_workers_as_bytes_through_a_segment_removed_after(
    pools: Callable[[int], WorkerPool],
) -> None:
    items = _blobs(24)  # 4 MB: one segment
    packed = shm.pack_args((items,), "zphtest_")
    assert packed.name is not None and len(packed.data) < 10_000
    shm.discard(packed)
    pool = pools(2)
    got = await asyncio.gather(*(pool.run("s", pipeline_fns.describe, items) for _ in range(4)))
    assert all(g == _expected(items) for g in got)
    assert {kind for kind, _, _ in got[0]} == {"bytes", "int"}
    assert _busy(pool.segment_prefix) == []  # the arguments' segments too


async def test_a_call_cancelled_before_it_ran_removes_its_arguments_segment(
    pools: Callable[[int], WorkerPool],
) -> None:
    pool = pools(1)
    busy = asyncio.ensure_future(pool.run("s", pipeline_fns.arrays, 0))
    waiting = asyncio.ensure_future(pool.run("s", pipeline_fns.describe, _blobs(24)))
    await asyncio.sleep(0)  # both submitted
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await busy
    got = await pool.run("s", pipeline_fns.describe, _blobs(3))
    assert got == _expected(_blobs(3))
    assert _busy(pool.segment_prefix) == []


def test_a_full_shared_memory_at_reservation_falls_back_and_leaves_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno

    def full(fd: int, offset: int, length: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full, raising=False)
    before = set(_segments("zphfull_"))
    packed = shm.pack(pipeline_fns.arrays(4), "zphfull_")
    assert packed.name is None and packed.inline
    assert set(_segments("zphfull_")) == before == set()
    _assert_same(shm.unpack(packed), pipeline_fns.arrays(4))


def test_arguments_arrive_equal_whatever_the_mix_of_small_and_large_values() -> None:
    text = [{"id": i, "text": "x" * 1600} for i in range(1024)]
    late = text[:8] + _blobs(4)  # large bytes only after the first items: sent in the pickle
    for items in (text, late, _blobs(24), []):
        packed = shm.pack_args(("map", items, 7), "zphtest_")
        try:
            assert shm.unpack_args(packed) == ("map", items, 7)
        finally:
            shm.discard(packed)
    assert _busy("zphtest_") == []


def test_an_array_argument_is_a_copy_not_a_view_of_a_segment_used_again() -> None:
    packed = shm.pack_args(("map", [np.full(300_000, 1.0)], _blobs(8)), "zphtest_")
    (_, [array], blobs) = shm.unpack_args(packed)
    shm.discard(packed)
    again = shm.pack_args(("map", [np.full(300_000, 2.0)], _blobs(8)), "zphtest_")
    assert again.name == packed.name and again.kept  # written over the same pages
    assert shm.unpack_args(again)[1][0][0] == 2.0
    assert array.min() == array.max() == 1.0 and blobs == _blobs(8)
    shm.discard(again)


def _ours() -> list[str]:
    """Segments of every pool of this process."""
    return _segments(f"zph{os.getpid():x}p")


def _images_pipeline(n: int) -> Any:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    ds = Dataset.from_records("ids", [{"id": i} for i in range(n)], samples_per_shard=250)
    ws = StaticMixtureWorkSource([ds], seed=0, stop_after_passes=1)
    return Pipeline(ws, world_size=1, rank=0).map(pipeline_fns.image_of, processes=2).batch(32)


def test_a_pipeline_left_early_or_failing_leaves_no_segment() -> None:
    pipe = _images_pipeline(900)  # no sample 977: runs to its end
    assert sum(len(b["image"]) for b in pipe) == 900
    assert _ours() == []
    pipe = _images_pipeline(4000)
    for _ in zip(range(2), pipe, strict=False):
        pass  # left after two batches, blocks still in flight both ways
    pipe.close()
    assert _ours() == []
    with pytest.raises(KeyError, match="977"):
        for _ in _images_pipeline(4000):
            pass
    assert _ours() == []


def test_the_child_process_engine_with_workers_gets_the_same_batches_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    for s in range(6):  # on disk: the engine's child is spawned, and reads it itself
        lines = "".join(f'{{"id": {i}}}\n' for i in range(s * 100, (s + 1) * 100))
        (tmp_path / f"part-{s}.jsonl").write_text(lines)
    before = set(_segments("zph"))

    def run(engine: str) -> list[list[int]]:
        ds = Dataset.from_path("ids", str(tmp_path), index_cache=False)
        ws = StaticMixtureWorkSource([ds], seed=3, stop_after_passes=1)
        pipe = Pipeline(ws, world_size=1, rank=0, lanes=2, engine=engine)
        batches = pipe.map(pipeline_fns.image_of, processes=2).batch(64)
        return [b["image"][:, 0, 0, 0].tolist() for b in batches]

    thread, child = run("thread"), run("process")
    assert thread == child and sum(map(len, child)) == 600
    assert set(_segments("zph")) <= before  # the child's pool removed its own


async def test_a_result_is_freed_as_soon_as_its_caller_drops_it(
    pools: Callable[[int], WorkerPool],
) -> None:
    import gc
    import weakref

    pool = pools(1)
    gc.disable()  # freed by reference counting alone: no cycle may hold a block of images
    try:
        got = await pool.run("s", pipeline_fns.arrays, 5)
        image = weakref.ref(got["images"][0])
        del got
        # The next result comes back once the pool's result thread has let go of this one.
        await pool.run("s", pipeline_fns.arrays, 6)
        assert image() is None
    finally:
        gc.enable()


def test_a_forked_child_starts_with_its_own_lock_and_no_segments() -> None:
    """A DataLoader worker forked while another thread held the lock must not hang, and
    must not write into the parent's segments."""
    kept = shm.pack(pipeline_fns.arrays(0), "zphtest_")
    saved = (shm._lock, shm._own, shm._seen)
    saved[0].acquire()  # as if the pool's result thread held it at the fork
    try:
        shm._forget_in_child()  # what os.register_at_fork runs in the child
        assert shm._own == {} and not shm._seen
        fresh = shm.pack(pipeline_fns.arrays(1), "zphtest_")  # no deadlock
        assert fresh.name != kept.name
        _assert_same(shm.unpack(fresh), pipeline_fns.arrays(1))
        shm.sweep("zphtest_")
    finally:
        saved[0].release()
        shm._lock, shm._own, shm._seen = saved


@pytest.mark.skipif(not shm.AVAILABLE, reason="needs POSIX shared memory")
def test_a_segment_is_known_to_the_tracker_before_it_exists(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kill between creating a segment and telling the resource tracker of it would leave
    the segment behind: the tracker hears of it first, and forgets it if creating fails."""
    events: list[tuple[str, str]] = []
    tracker = shm.resource_tracker
    monkeypatch.setattr(tracker, "register", lambda name, kind: events.append(("register", name)))
    monkeypatch.setattr(
        tracker, "unregister", lambda name, kind: events.append(("unregister", name))
    )
    real_open = shm._posixshmem.shm_open

    def refused(name: str, *args: Any) -> int:
        events.append(("open", name))
        raise OSError(24, "Too many open files")

    monkeypatch.setattr(shm._posixshmem, "shm_open", refused)
    assert shm._segment("zphtest", 1 << 20) is None
    name = events[0][1]
    assert events == [("register", name), ("open", name), ("unregister", name)]
    events.clear()

    def opened(name: str, *args: Any) -> int:
        events.append(("open", name))
        fd: int = real_open(name, *args)
        return fd

    monkeypatch.setattr(shm._posixshmem, "shm_open", opened)
    made = shm._segment("zphtest", 1 << 20)
    assert made is not None
    try:
        assert [e[0] for e in events] == ["register", "open"]
    finally:
        shm._unlink(made)

"""The pipeline end to end: order, coverage, offload, errors, cleanup, distribution."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import os
import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests import pipeline_fns as fns
from tests.formatdata import (
    write_jsonl,
    write_more_compressed_jsonl,
    write_parquet,
    write_webdataset,
)
from zephon import Dataset
from zephon.errors import ConfigError, FormatError, WorkerCrashed, ZephonError
from zephon.pipeline import Pipeline
from zephon.pipeline.state import lane_entries
from zephon.plan import StaticMixtureWorkSource
from zephon.storage import RetryPolicy
from zephon.testing import FaultProxy, Faults, GCSEmulator, S3Endpoint

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def records() -> list[dict[str, Any]]:
    return [{"id": i, "text": f"document number {i}"} for i in range(3000)]


@pytest.fixture(scope="module")
def toy(records: list[dict[str, Any]]) -> Dataset:
    return Dataset.from_records("toy", records, samples_per_shard=250)


def source(*datasets: Dataset, **kw: Any) -> StaticMixtureWorkSource:
    kw.setdefault("chunk_size", 128)
    return StaticMixtureWorkSource(list(datasets), seed=7, **kw)


def ids(items: list[Any]) -> list[int]:
    return [s["id"] for s in items]


def test_sync_iteration_yields_one_pass_in_curriculum_order(toy: Dataset) -> None:
    ws = source(toy, shuffle="global")
    out = list(Pipeline(ws))
    assert sorted(ids(out)) == list(range(3000))
    chunks = [c for c in ws.chunks(0, 1)]
    planned = [int(s) for c in chunks for s in c.shards * 250 + c.samples]
    assert ids(out) == planned  # exactly the planner's order


async def test_order_is_independent_of_concurrency_processes_and_prefetch(toy: Dataset) -> None:
    ws = source(toy, shuffle="block")

    async def run(pipe: Pipeline) -> list[Any]:
        return [b async for b in pipe]

    def build(inflight: int, procs: int, prefetch: int, decode: int) -> Pipeline:
        return (
            Pipeline(ws, lanes=2, max_inflight_requests=inflight, decode_processes=decode)
            .map(fns.double, processes=procs)
            .filter(fns.keep_even, processes=procs)
            .batch(16)
            .prefetch(prefetch)
        )

    reference = await run(build(1, 0, 1, 0))
    for inflight, procs, prefetch, decode in [(16, 0, 4, 0), (64, 2, 2, 0), (64, 0, 8, 2)]:
        got = await run(build(inflight, procs, prefetch, decode))
        assert len(got) == len(reference)
        for a, b in zip(got, reference, strict=True):
            assert a["text"] == b["text"]
            np.testing.assert_array_equal(a["double"], b["double"])


def test_map_none_drops_and_async_functions_work(toy: Dataset) -> None:
    async def tag(sample: dict[str, Any]) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {**sample, "tag": True}

    out = list(Pipeline(source(toy, shuffle="none")).map(fns.drop_multiples_of_5).map(tag))
    assert ids(out) == [i for i in range(3000) if i % 5]
    assert all(s["tag"] for s in out)


def test_apply_runs_a_user_async_generator(toy: Dataset) -> None:
    async def pairs(stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        pending = None
        async for sample in stream:
            if pending is None:
                pending = sample
            else:
                yield {"ids": (pending["id"], sample["id"])}
                pending = None

    out = list(Pipeline(source(toy, shuffle="none")).apply(pairs))
    assert [s["ids"] for s in out] == [(i, i + 1) for i in range(0, 3000, 2)]


def test_batches_are_numpy_columns(toy: Dataset) -> None:
    out = list(Pipeline(source(toy, shuffle="none")).batch(64, drop_last=True))
    assert len(out) == 3000 // 64
    assert out[0]["id"].dtype.kind == "i" and out[0]["id"].shape == (64,)
    assert out[0]["text"][:2] == ["document number 0", "document number 1"]
    tail = list(Pipeline(source(toy, shuffle="none")).batch(64))
    assert len(tail) == len(out) + 1 and len(tail[-1]["id"]) == 3000 % 64


def test_worker_errors_keep_their_type_and_name_the_sample(toy: Dataset) -> None:
    pipe = Pipeline(source(toy, shuffle="none")).map(fns.fail_on_13, processes=2)
    with pytest.raises(KeyError) as info:
        list(pipe)
    notes = "\n".join(info.value.__notes__)
    assert "sample 13" in notes and "fail_on_13" in notes and "in stage 'map#0[0]'" in notes


def test_a_killed_worker_raises_worker_crashed(toy: Dataset) -> None:
    pipe = Pipeline(source(toy, shuffle="none")).map(fns.die_on_7, processes=2)
    with pytest.raises(WorkerCrashed, match="map#0"):
        list(pipe)


def test_in_process_errors_name_the_stage(toy: Dataset) -> None:
    def boom(sample: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("bad value")

    with pytest.raises(ValueError, match="bad value") as info:
        list(Pipeline(source(toy)).map(boom))
    assert any("in stage 'map#0[0]'" in n for n in info.value.__notes__)


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_early_break_releases_everything(toy: Dataset) -> None:
    before = _threads()
    pipe = Pipeline(source(toy), lanes=2).map(fns.double, processes=2).batch(8)
    it = iter(pipe)
    first = next(it)
    assert len(first["id"]) == 8
    run = pipe._last
    assert run is not None and run.pool is not None and run.pool.pids()
    pids = list(run.pool.pids())
    it.close()  # what `break` does to a for loop's iterator
    assert run.task is None  # finished, and let go of (its exception holds the frames)
    assert run.pool is None
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert _threads() <= before | {"QueueFeederThread"}
    assert all(s.backend._session is None for s in run.storages if hasattr(s.backend, "_session"))


async def test_async_early_break_leaves_no_tasks(toy: Dataset) -> None:
    pipe = Pipeline(source(toy), lanes=2).batch(4)
    async with contextlib.aclosing(pipe.aiter()) as it:
        async for _ in it:
            break
    others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
    assert others == []


class _Watched:
    """A sample a weak reference can watch."""

    __slots__ = ("__weakref__", "id")

    def __init__(self, id_: int) -> None:
        self.id = id_


@pytest.mark.parametrize("tail", ["none", "shuffle", "batch"])
def test_a_stopped_run_frees_every_item_it_buffered(toy: Dataset, tail: str) -> None:
    """Breaking out frees what the run had read ahead at once, not at the next full garbage
    collection (a cancelled run's frames sit in reference cycles until then)."""
    alive: weakref.WeakSet[_Watched] = weakref.WeakSet()

    def watch(sample: dict[str, Any]) -> _Watched:
        item = _Watched(sample["id"])
        alive.add(item)
        return item

    pipe = Pipeline(source(toy), lanes=2).map(watch)
    pipe = pipe.shuffle(256) if tail == "shuffle" else pipe.batch(8) if tail == "batch" else pipe
    gc.collect()
    gc.disable()  # what the run leaves in cycles stays there: only refcounts free it
    try:
        it = iter(pipe)
        held = [next(it) for _ in range(3)]
        assert len(alive) > 64  # the run had read ahead
        it.close()
        mine = {id(x) for item in held for x in (item if isinstance(item, list) else [item])}
        assert {id(x) for x in alive} <= mine
        lanes = lane_entries(pipe.checkpoint()).values()
        assert sum(lane["items"] for lane in lanes) == 3  # what was received still counts
    finally:
        gc.enable()


async def test_a_stopped_async_run_frees_every_item_it_buffered(toy: Dataset) -> None:
    alive: weakref.WeakSet[_Watched] = weakref.WeakSet()

    def watch(sample: dict[str, Any]) -> _Watched:
        item = _Watched(sample["id"])
        alive.add(item)
        return item

    gc.collect()
    gc.disable()
    try:
        async with contextlib.aclosing(Pipeline(source(toy), lanes=2).map(watch).aiter()) as it:
            first = await anext(it)
        assert [x.id for x in alive] == [first.id]
    finally:
        gc.enable()


def test_bad_samples_are_skipped_and_counted_when_asked(tmp_path: Path) -> None:
    lines = [f'{{"id": {i}}}' if i % 100 != 42 else "{broken" for i in range(500)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    ds = Dataset.from_path("web", str(tmp_path))
    with pytest.raises(FormatError, match="sample 42"):
        list(Pipeline(source(ds, shuffle="none")))
    pipe = Pipeline(source(ds, shuffle="none"), on_error="skip")
    out = list(pipe)
    assert ids(out) == [i for i in range(500) if i % 100 != 42]
    skipped = pipe.stats()["skipped"]
    assert [s["sample"] for s in skipped] == [42, 142, 242, 342, 442]
    assert all(s["dataset"] == "web" and s["shard"].endswith("a.jsonl") for s in skipped)
    with pytest.raises(ZephonError, match="skip budget"):
        list(Pipeline(source(ds), on_error="skip", max_skipped=3))


def test_adjacent_pooled_steps_run_in_one_worker_call(toy: Dataset) -> None:
    ws = source(toy, shuffle="none")
    pipe = (
        Pipeline(ws)
        .map(fns.double, processes=2)
        .map(fns.drop_multiples_of_5, processes=2)
        .filter(fns.keep_even, processes=2)
        .map(fns.fail_on_13, processes=0)
    )
    assert pipe.explain().count("(in the same worker call)") == 2  # the in-process one is not
    pipe = pipe.map(fns.fail_on_13, processes=2).filter(fns.keep_even)
    assert ids(list(pipe)) == [i for i in range(3000) if i % 5 and i % 2 == 0]
    stages = set(pipe.stats()["stages"])
    assert "map#0+1+2[0]" in stages and not any(s.startswith("map#1[") for s in stages)
    fused = Pipeline(ws).map(fns.double, processes=2).map(fns.fail_on_13, processes=2)
    with pytest.raises(KeyError, match="no luck for 13") as info:
        list(fused)
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "fail_on_13" in notes and "sample 13" in notes  # the failing step, not the chain


@pytest.mark.parametrize("processes", [0, 2])
def test_a_steps_format_error_is_skipped_and_counted_when_asked(
    toy: Dataset, processes: int
) -> None:
    ws = source(toy, shuffle="none")
    with pytest.raises(FormatError, match="record 13"):
        list(Pipeline(ws).map(fns.reject_13, processes=processes))
    pipe = (
        Pipeline(ws, on_error="skip")
        .map(fns.double, processes=processes)
        .map(fns.reject_13, processes=processes)
    )
    out = list(pipe)
    assert ids(out) == [i for i in range(3000) if i != 13]
    [skipped] = pipe.stats()["skipped"]
    assert skipped["dataset"] == toy.name and skipped["sample"] == 13
    assert skipped["shard"] == toy.shards[0].uri and "reject_13" in skipped["error"]
    with pytest.raises(KeyError, match="no luck"):  # not bad input: never skipped
        list(Pipeline(ws, on_error="skip").map(fns.fail_on_13, processes=processes))


def test_ranks_split_lanes_and_together_cover_the_pass(toy: Dataset) -> None:
    ws = source(toy, shuffle="block")
    single = Counter(ids(list(Pipeline(ws, rank=0, world_size=1, lanes=4))))
    parts = [ids(list(Pipeline(ws, rank=r, world_size=2, lanes=4))) for r in range(2)]
    assert not set(parts[0]) & set(parts[1])
    assert Counter(parts[0]) + Counter(parts[1]) == single
    assert set(single) == set(range(3000))


def test_rank_and_world_size_from_the_environment(
    toy: Dataset, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    pipe = Pipeline(source(toy))
    assert (pipe.rank, pipe.world_size, pipe.lanes, list(pipe.my_lanes)) == (1, 3, 3, [1])
    with pytest.raises(ConfigError, match="multiple of world_size"):
        Pipeline(source(toy), lanes=4)


@pytest.mark.parametrize("processes", [0, 2])
def test_stats_explain_and_progress(
    toy: Dataset, capsys: pytest.CaptureFixture[str], processes: int
) -> None:
    pipe = Pipeline(source(toy), lanes=2).map(fns.double, processes=processes).batch(10)
    text = pipe.explain()
    where = "in process" if not processes else "2 processes"
    assert "lanes [0, 1] of 2" in text and f"map(double; {where})" in text and "batch(10" in text
    out = list(pipe.iter(progress=True))
    st = pipe.stats()
    # each lane holds a fair share of the 3,000 samples: 1,500, batched per lane
    assert st["delivered"] == len(out) == 150 + 150
    # samples, not blocks, whether the map runs here or in the pool
    for key in ("items_in", "items_out"):
        assert st["stages"]["map#0[0]"][key] + st["stages"]["map#0[1]"][key] == 3000
    assert st["fetch"]["requests"] > 0 and st["fetch"]["bytes"] > 0
    assert st["fetch"]["p50_latency_s"] is not None
    err = capsys.readouterr().err  # not a terminal: plain lines for a log, no redraws
    assert "\r" not in err and err.startswith("zephon: 300 batches in ")
    assert "batches/s, data read at " in err


def _mixed(tmp_path: Path) -> list[Dataset]:
    write_jsonl(tmp_path / "web", shards=4, per_shard=60)
    write_parquet(tmp_path / "tab", shards=2)
    return [
        Dataset.from_path("web", str(tmp_path / "web")),
        Dataset.from_path("tab", str(tmp_path / "tab")),
    ]


async def _upload(base: str, options: dict[str, Any], src: Path) -> None:
    from tests.integration.test_datasets import _upload as upload

    await upload(base, options, src)


@pytest.mark.parametrize("budget", [None, "small"])
@pytest.mark.parametrize("fmt", ["jsonl", "webdataset", "compressed"])
async def test_a_scanned_dataset_is_fetched_once_in_its_first_epoch(
    fmt: str, budget: str | None, tmp_path: Path, s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    """Also when the fetch budget holds a fraction of the scan: the rest waits on local disk."""
    if fmt == "compressed":  # gzip, bz2, xz, zstd streams: whole-shard reads
        expected = write_more_compressed_jsonl(tmp_path / "src")
    else:
        expected = (write_jsonl if fmt == "jsonl" else write_webdataset)(tmp_path / "src", 6, 50)
    options = s3_endpoint.storage_options()
    base = f"s3://{s3_bucket}/{fmt}/"
    await _upload(base, options, tmp_path / "src")
    size = sum(p.stat().st_size for p in (tmp_path / "src").iterdir())
    ds = await Dataset.afrom_path("d", base, storage_options=options, index_cache=False)
    assert ds.discovery_stats.bytes_read == size  # every shard scanned once
    ws = StaticMixtureWorkSource([ds], seed=1, chunk_size=32, stop_after_passes=1)
    small = {"fetch_budget_bytes": size // 3} if budget else {}
    pipe = Pipeline(ws, lanes=2, **small)
    got = [s async for s in pipe]
    assert len(got) == len(expected)
    fetch = pipe.stats()["fetch"]
    assert fetch["scan_spilled_bytes"] > (0.5 * size if budget else -1)
    assert fetch["bytes"] < 0.05 * size  # the scan's bytes served the epoch
    assert fetch["scan_reused_bytes"] > 0.9 * size
    again = Pipeline(ws, lanes=2)  # the scan was handed over once: a second run fetches
    assert len([s async for s in again]) == len(expected)
    assert again.stats()["fetch"]["bytes"] > 0.9 * size
    none = await Dataset.afrom_path(
        "d", base, storage_options=options, index_cache=False, keep_scan_bytes=0
    )
    plain = Pipeline(StaticMixtureWorkSource([none], seed=1, chunk_size=32, stop_after_passes=1))
    assert len([s async for s in plain]) == len(expected)
    assert plain.stats()["fetch"]["scan_reused_bytes"] == 0


async def test_a_fork_after_discovery_moves_the_scan_to_disk_and_the_epoch_still_uses_it(
    tmp_path: Path, s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    """What ``os.fork`` runs first (a DataLoader starting workers after discovery): the
    dataset's scanned bytes go to the shared file, and the first epoch still reads them
    there."""
    from zephon.storage import keep as keep_module

    expected = write_jsonl(tmp_path / "src", 6, 50)
    options = s3_endpoint.storage_options()
    base = f"s3://{s3_bucket}/forked/"
    await _upload(base, options, tmp_path / "src")
    size = sum(p.stat().st_size for p in (tmp_path / "src").iterdir())
    ds = await Dataset.afrom_path("d", base, storage_options=options, index_cache=False)
    keep_module._before_fork()  # the hook os.fork runs in the parent
    ws = StaticMixtureWorkSource([ds], seed=1, chunk_size=32, stop_after_passes=1)
    pipe = Pipeline(ws, lanes=2)
    got = [s async for s in pipe]
    assert len(got) == len(expected)
    fetch = pipe.stats()["fetch"]
    assert fetch["scan_spilled_bytes"] == size  # all of it moved to the file at the fork
    assert fetch["bytes"] < 0.05 * size and fetch["scan_reused_bytes"] > 0.9 * size


async def test_parquet_footer_probes_serve_the_first_epoch(
    tmp_path: Path, s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    """Discovery reads each small file's last 64 KiB (the footer and the row groups before
    it); the first epoch fetches only the rest, so the two together fetch each byte about
    once (they fetched 1.5x before)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    src = tmp_path / "src"
    src.mkdir()
    rng = np.random.default_rng(0)
    for f in range(6):
        ids = list(range(f * 2000, (f + 1) * 2000))
        text = [rng.bytes(40).hex() for _ in ids]  # incompressible: ~150 KB a file
        pq.write_table(
            pa.table({"id": ids, "text": text}), src / f"p{f}.parquet", row_group_size=500
        )
    size = sum(p.stat().st_size for p in src.iterdir())
    options = s3_endpoint.storage_options()
    base = f"s3://{s3_bucket}/pq/"
    await _upload(base, options, src)
    ds = await Dataset.afrom_path("t", base, storage_options=options, index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=1, stop_after_passes=1)
    pipe = Pipeline(ws, lanes=2, range_cache_bytes=0)
    ids = sorted([s["id"] async for s in pipe])
    assert ids == list(range(12000))
    fetched = ds.discovery_stats.bytes_read + pipe.stats()["fetch"]["bytes"]
    assert ds.discovery_stats.bytes_read > 0.3 * size  # the probes: a large part of each file
    assert fetched <= 1.05 * size
    assert pipe.stats()["fetch"]["scan_reused_bytes"] > 0.25 * size


@pytest.mark.parametrize("server", ["s3", "gcs"])
async def test_exactly_once_per_pass_from_cloud_servers(
    server: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    expected_web = write_jsonl(tmp_path / "web", shards=4, per_shard=60)
    expected_tab = write_parquet(tmp_path / "tab", shards=2)
    if server == "s3":
        endpoint: S3Endpoint = request.getfixturevalue("s3_endpoint")
        base = f"s3://{request.getfixturevalue('s3_bucket')}/"
        options: dict[str, Any] = endpoint.storage_options()
    else:
        emulator: GCSEmulator = request.getfixturevalue("gcs_emulator")
        base = f"gs://{request.getfixturevalue('gcs_bucket')}/"
        options = {"endpoint_url": emulator.url}
    await _upload(base, options, tmp_path)
    web = await Dataset.afrom_path("web", base + "web/", storage_options=options)
    tab = await Dataset.afrom_path("tab", base + "tab/", storage_options=options)
    ws = StaticMixtureWorkSource(
        [web, tab], seed=3, chunk_size=64, stop_after_passes=2, shuffle="global"
    )
    out = [s async for s in Pipeline(ws, lanes=2)]
    got = Counter(json.dumps(s, sort_keys=True) for s in out)
    everything = [json.dumps(s, sort_keys=True) for s in expected_web + expected_tab]
    assert set(got) == set(everything)  # nothing foreign
    assert min(got.values()) >= 2  # two full passes of each dataset
    # extra samples only where a lane kept looping a dataset while it finished the other
    assert sum(got.values()) - 2 * len(everything) < 0.1 * len(everything)


async def test_faults_neither_lose_nor_duplicate_samples(
    s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    write_jsonl(tmp_path / "web", shards=6, per_shard=80)
    base = f"s3://{s3_bucket}/"
    await _upload(base, s3_endpoint.storage_options(), tmp_path)
    clean = await Dataset.afrom_path(
        "web", base + "web/", storage_options=s3_endpoint.storage_options()
    )
    # no coalescing: one read per sample, so hundreds of requests meet the faults
    reference = [s async for s in Pipeline(source(clean, shuffle="global", coalesce_gap_bytes=0))]
    faults = Faults(throttle_rate=0.2, reset_rate=0.05, truncate_rate=0.05, seed=11)
    with FaultProxy(s3_endpoint.endpoint_url, faults) as proxy:
        flaky = await Dataset.afrom_path(
            "web", base + "web/", storage_options=s3_endpoint.storage_options(proxy.url)
        )
        pipe = Pipeline(
            source(flaky, shuffle="global", coalesce_gap_bytes=0),
            retry=RetryPolicy(max_attempts=12, base_delay_s=0.001),
        )
        got = [s async for s in pipe]
        assert sum(proxy.injected.values()) > 50
    assert got == reference
    assert pipe.stats()["fetch"]["retries"] > 0


def test_configuration_errors(toy: Dataset) -> None:
    ws = source(toy)
    with pytest.raises(ConfigError, match="on_error"):
        Pipeline(ws, on_error="ignore")
    with pytest.raises(ConfigError, match="batch size"):
        Pipeline(ws).batch(0)
    with pytest.raises(ConfigError, match="after batch"):
        Pipeline(ws).batch(2).batch(2)
    with pytest.raises(ConfigError, match="rank"):
        Pipeline(ws, rank=2, world_size=2)
    gc.collect()


def test_lambdas_and_closures_run_in_workers_by_value_and_what_cannot_travel_is_refused(
    toy: Dataset,
) -> None:
    pipe = Pipeline(source(toy))
    offset = 1000

    def local(sample: Any) -> bool:
        return int(sample["id"]) % 2 == 0

    expected = [s["id"] + offset for s in pipe.filter(local) if True]
    got = pipe.filter(local, processes=2).map(lambda s: s["id"] + offset, processes=2)
    assert list(got) == expected
    lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"'.*holds_a_lock' cannot be sent to worker processes"):

        def holds_a_lock(sample: Any) -> Any:
            with lock:
                return sample

        pipe.map(holds_a_lock, processes=2)
    pipe.map(lambda s: (lock, s))  # in process, anything goes


async def test_sync_dataset_calls_work_inside_a_running_loop(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text("".join(f'{{"id": {i}}}\n' for i in range(10)))
    ds = Dataset.from_path("nb", str(tmp_path))  # as in a notebook cell
    assert ds.num_samples == 10 and ds.head(2) == [{"id": 0}, {"id": 1}]


MAIN_WITHOUT_FILE = """
import sys
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

def doubled(sample):
    return {**sample, "doubled": 2 * sample["id"]}

ws = StaticMixtureWorkSource([Dataset.from_path("t", sys.argv[-1])], seed=1, stop_after_passes=1)
pipe = Pipeline(ws, rank=0, world_size=1).map(doubled, processes=2).filter(
    lambda s: s["id"] % 3 == 0, processes=2)
print(sorted(s["doubled"] for s in pipe))
"""


@pytest.mark.parametrize("how", ["-c", "stdin"])
def test_functions_of_a_main_without_a_file_run_in_workers(tmp_path: Path, how: str) -> None:
    """``python -c``, a REPL or a notebook: workers cannot import their ``__main__``, so its
    functions travel by value (they once failed in every block). A script on stdin cannot
    start workers at all (multiprocessing's own limit): refused at ``map()``, saying why."""
    import subprocess
    import sys

    (tmp_path / "a.jsonl").write_text("".join(json.dumps({"id": i}) + "\n" for i in range(300)))
    argv = [sys.executable, "-c", MAIN_WITHOUT_FILE] if how == "-c" else [sys.executable, "-"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    stdin = MAIN_WITHOUT_FILE if how == "stdin" else None
    run = subprocess.run(
        [*argv, str(tmp_path)], input=stdin, capture_output=True, text=True, timeout=120, env=env
    )
    if how == "stdin":  # multiprocessing would run "<stdin>" as a file in every worker
        assert run.returncode == 1 and "ConfigError: worker processes cannot start" in run.stderr
        assert "save the script to a file" in run.stderr
        return
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == str([2 * i for i in range(300) if i % 3 == 0])

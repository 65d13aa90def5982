"""CPU-heavy steps on Ray actors, against a real local Ray head (``ray start --head`` on
loopback with 2 CPUs): the same output and checkpoints as in process, dead actors replaced,
user errors with their type, every actor released on close."""

from __future__ import annotations

import asyncio
import os
import select
import subprocess
import sys
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource, WorkerCrashed
from zephon.errors import ConfigError
from zephon.executors import Local, Ray

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def address() -> Iterator[str]:
    from zephon.testing.ray import RayCluster

    cluster = RayCluster(cpus=2)
    try:
        yield cluster.start()
    finally:
        ray.shutdown()
        cluster.stop()


@pytest.fixture(scope="module")
def data() -> list[Dataset]:
    return [
        Dataset.from_records(
            "a",
            [{"id": i, "text": f"doc {i} " * (i % 7 + 1)} for i in range(600)],
            samples_per_shard=50,
        ),
        Dataset.from_records(
            "b", [{"id": 10_000 + i, "text": f"b {i}"} for i in range(300)], samples_per_shard=40
        ),
    ]


def pipeline(data: list[Dataset], lanes: int = 2, **place: Any) -> Pipeline:
    ws = StaticMixtureWorkSource(data, seed=3, shuffle="global", chunk_size=64)
    return (
        Pipeline(ws, rank=0, world_size=1, lanes=lanes)
        .shuffle(37)
        .map(fns.double, **place)
        .filter(fns.keep_even, **place)
        .batch(16)
    )


def ids(batches: list[Any]) -> list[int]:
    return [int(x) for b in batches for x in b["id"]]


def test_the_same_output_as_in_process(data: list[Dataset], address: str) -> None:
    want = ids(list(pipeline(data)))
    executor = Ray(num_actors=2, address=address)
    assert ids(list(pipeline(data, executor=executor))) == want
    decoded = pipeline(data, executor=executor).decode(executor=executor)
    assert ids(list(decoded)) == want


def test_checkpoints_are_interchangeable_with_local_pools(
    data: list[Dataset], address: str
) -> None:
    want = ids(list(pipeline(data)))
    for first, second in [
        ({"executor": Ray(2, address=address)}, {}),
        ({"executor": Local(2)}, {"executor": Ray(2, address=address)}),
    ]:
        pipe = pipeline(data, **first)
        it = iter(pipe)
        head = [next(it) for _ in range(9)]
        state = pipe.checkpoint()
        del it
        again = pipeline(data, **second)
        again.restore(state)
        assert ids(head) + ids(list(again)) == want


def test_a_dead_actor_is_replaced_and_its_block_run_again(
    data: list[Dataset], address: str, tmp_path: Path
) -> None:
    want = ids(list(pipeline(data)))
    dies_once = partial(fns.die_once_on_7, str(tmp_path / "died"))
    ws = StaticMixtureWorkSource(data, seed=3, shuffle="global", chunk_size=64)
    pipe = (
        Pipeline(ws, rank=0, world_size=1, lanes=2)
        .shuffle(37)
        .map(dies_once, executor=Ray(2, address=address))
        .map(fns.double)
        .filter(fns.keep_even)
        .batch(16)
    )
    assert ids(list(pipe)) == want
    assert (tmp_path / "died").exists()  # it did die once


def test_an_actor_that_keeps_dying_raises_worker_crashed(data: list[Dataset], address: str) -> None:
    ws = StaticMixtureWorkSource(data, seed=3)
    pipe = Pipeline(ws).map(fns.die_on_7, executor=Ray(2, address=address, max_retries=1))
    with pytest.raises(WorkerCrashed, match=r"stage 'map#0\[0\]'.*2 times"):
        list(pipe)


def test_a_user_error_keeps_its_type_and_traceback(data: list[Dataset], address: str) -> None:
    pipe = Pipeline(StaticMixtureWorkSource(data, seed=3)).map(
        fns.fail_on_13, executor=Ray(1, address=address)
    )
    with pytest.raises(KeyError, match="no luck for 13") as info:
        list(pipe)
    notes = "\n".join(info.value.__notes__)
    assert "sample 13" in notes and "raised in a Ray actor" in notes
    assert 'pipeline_fns.py", line' in notes and "in fail_on_13" in notes


def test_close_releases_every_actor(data: list[Dataset], address: str) -> None:
    pipe = pipeline(data, executor=Ray(2, address=address))
    it = iter(pipe)
    next(it)
    run = pipe._last
    assert run is not None and run.res is not None and run.loop is not None
    (pool,) = run.res.remote.values()
    pids = asyncio.run_coroutine_threadsafe(pool.pids(), run.loop).result(30)
    assert len(set(pids)) == 2 and os.getpid() not in pids
    it.close()  # what `break` does
    deadline = time.monotonic() + 30
    for pid in pids:  # killed by close(): wait for each to be gone, bounded, without sleeps
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            assert select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0], pid
        finally:
            os.close(fd)


def test_placement_errors_are_config_errors(data: list[Dataset]) -> None:
    pipe = Pipeline(StaticMixtureWorkSource(data))
    with pytest.raises(ConfigError, match="not both"):
        pipe.map(fns.double, processes=2, executor=Ray(2))
    with pytest.raises(ConfigError, match="executor must be"):
        pipe.map(fns.double, executor="ray")
    with pytest.raises(ConfigError, match="num_actors"):
        Ray(num_actors=0)
    assert "secret" not in repr(Ray(address="ray://user:secret@head:10001"))
    placed = pipe.map(fns.double, executor=Ray(3)).explain()
    assert "Ray(num_actors=3" in placed and "6 blocks in flight per lane" in placed


def test_image_steps_on_actors_match_in_process_in_every_pass(address: str) -> None:
    import base64
    import io

    import numpy as np
    from PIL import Image

    def png(i: int) -> str:
        buf = io.BytesIO()
        pixels = np.random.default_rng(i).integers(0, 255, (30 + i, 40, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode()

    images = Dataset.from_records(
        "img", [{"id": i, "png": png(i)} for i in range(24)], samples_per_shard=8
    )

    def run(**place: Any) -> list[Any]:
        ws = StaticMixtureWorkSource([images], seed=1, stop_after_passes=2)
        pipe = (
            Pipeline(ws, rank=0, world_size=1)
            .decode_image("png", **place)
            .random_resized_crop(16)
            .flip()
            .map(fns.with_pass, **place)
            .batch(8)
        )
        return [(b["id"].tolist(), b["pass"].tolist(), b["png"].tobytes()) for b in pipe]

    want = run()
    assert {p for _, passes, _ in want for p in passes} == {0, 1}
    assert run(executor=Ray(num_actors=2, address=address)) == want


LOCAL_DEFAULT = """
import ray
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.executors import Ray
from tests import pipeline_fns as fns

if __name__ == "__main__":
    ds = Dataset.from_records("a", [{"id": i, "text": "x"} for i in range(200)],
                              samples_per_shard=50)
    for _ in range(2):  # a second pipeline with a new Ray executor in the same process
        ws = StaticMixtureWorkSource([ds], seed=1, stop_after_passes=1)
        pipe = Pipeline(ws, rank=0, world_size=1).map(fns.double, executor=Ray(num_actors=1))
        print(sum(1 for _ in pipe), flush=True)
    print(ray.util.get_node_ip_address())
"""


def test_without_an_address_ray_starts_on_loopback_and_serves_two_pipelines(
    tmp_path: Path,
) -> None:
    """Started by Zephon, the cluster listens on 127.0.0.1: a machine whose routed address it
    cannot reach itself (containers, sandboxes) once timed out connecting to its own GCS."""
    script = tmp_path / "local_default.py"
    script.write_text(LOCAL_DEFAULT)
    root = Path(__file__).parents[2]
    env = {
        **os.environ,
        "PYTHONPATH": str(root),
        "HOME": str(tmp_path),
        "RAY_USAGE_STATS_ENABLED": "0",
    }
    for name in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        env.pop(name, None)
    run = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split() == ["200", "200", "127.0.0.1"]


def test_an_unreachable_cluster_is_a_config_error_saying_what_to_check() -> None:
    from zephon.engine.raypool import _connect_error

    error = _connect_error(
        ConnectionError("Failed to connect to GCS at 10.0.0.9:6379"), "ray://user:secret@head:10001"
    )
    assert isinstance(error, ConfigError) and "secret" not in str(error)
    assert "check the address" in str(error) and "Failed to connect to GCS" in str(error)
    token = _connect_error(RuntimeError("RPC error: InvalidAuthToken: missing"), None)
    assert "token" in str(token) and "RAY_AUTH_MODE" in str(token)

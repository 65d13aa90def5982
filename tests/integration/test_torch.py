"""torch adapters: tensors, DataLoader, StatefulDataLoader state dicts, torch.distributed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.formatdata import write_jsonl  # noqa: E402
from zephon import Dataset  # noqa: E402
from zephon.errors import ConfigError  # noqa: E402
from zephon.pipeline import Pipeline  # noqa: E402
from zephon.pipeline.state import lane_entries  # noqa: E402
from zephon.plan import StaticMixtureWorkSource  # noqa: E402

pytestmark = pytest.mark.integration


def build(root: str, rank: int | None = None, world: int | None = None, lanes: int = 4) -> Pipeline:
    ds = Dataset.from_path("web", root)
    ws = StaticMixtureWorkSource([ds], seed=2, shuffle="block", chunk_size=32)
    pipe = Pipeline(ws, rank=rank, world_size=world, lanes=lanes)
    return pipe.tokenize("bytes").pack(32).batch(4)


@pytest.fixture
def root(tmp_path: Path) -> str:
    write_jsonl(tmp_path / "web", shards=4, per_shard=50)
    return str(tmp_path / "web")


def test_to_torch_gives_tensors(root: str) -> None:
    batch = next(iter(build(root, 0, 1).to_torch()))
    assert isinstance(batch["input_ids"], torch.Tensor)
    assert batch["input_ids"].shape == (4, 32) and batch["input_ids"].dtype == torch.int32


def test_pin_memory_pins_where_an_accelerator_is_and_warns_where_none_is(root: str) -> None:
    """As DataLoader(pin_memory=True) does; torch itself raised mid-run on a CPU-only host."""
    from zephon.torch import _pinnable

    _pinnable.cache_clear()
    pipe = build(root, 0, 1).to_torch(pin_memory=True)
    if torch.accelerator.is_available():
        assert next(iter(pipe))["input_ids"].is_pinned()
        return
    with pytest.warns(RuntimeWarning, match="no accelerator"):
        batches = list(pipe)
    assert batches and not batches[0]["input_ids"].is_pinned()


def _with_pixels(batch: dict[str, Any]) -> dict[str, Any]:
    return {**batch, "pixels": np.full((1024, 1024, 3), batch["input_ids"][0, 0], np.uint8)}


def test_dataloader_workers_send_small_tensors_by_value_and_large_ones_shared(root: str) -> None:
    """A batch's small tensors cross to the trainer by value (a shared tensor costs the
    trainer a connection to the worker per tensor), large ones through shared memory; both
    arrive as plain tensors equal to what the pipeline gave."""
    from torch.utils.data import DataLoader

    def pipe() -> Any:
        return build(root, 0, 1).map(_with_pixels)

    alone = list(DataLoader(pipe().to_torch_dataset(), batch_size=None))
    mp = {"num_workers": 2, "multiprocessing_context": "forkserver"}
    got = list(DataLoader(pipe().to_torch_dataset(), batch_size=None, **mp))
    assert sorted(b["input_ids"].tolist() for b in got) == sorted(
        b["input_ids"].tolist() for b in alone
    )
    for b in got:
        assert type(b["input_ids"]) is torch.Tensor and type(b["pixels"]) is torch.Tensor
        assert not b["input_ids"].is_shared()  # 512 bytes: by value
        assert b["pixels"].is_shared() and b["pixels"].shape == (1024, 1024, 3)  # 3 MB
        assert int(b["pixels"][5, 5, 0]) == int(b["input_ids"][0, 0]) % 256


def test_dataloader_and_stateful_dataloader_resume(root: str) -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    full = [
        b["input_ids"] for b in DataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None)
    ]
    assert len(full) > 10 and all(isinstance(b, torch.Tensor) for b in full)
    loader = StatefulDataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None)
    head = []
    for i, b in enumerate(loader):
        head.append(b["input_ids"])
        if i == 6:
            break
    state = loader.state_dict()
    again = StatefulDataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None)
    again.load_state_dict(state)
    rest = [b["input_ids"] for b in again]
    assert len(head) + len(rest) == len(full)
    assert all(torch.equal(a, b) for a, b in zip(head + rest, full, strict=True))


def test_worker_pools_inside_dataloader_workers_are_a_config_error(root: str) -> None:
    """A DataLoader worker is a daemonic process, which cannot start processes: the pool's
    start failed with multiprocessing's bare AssertionError inside the pipeline."""
    from tests import pipeline_fns as fns

    ds = Dataset.from_path("web", root)
    ws = StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=4).map(fns.double, processes=2).batch(4)
    mp = {"num_workers": 2, "multiprocessing_context": "forkserver"}  # see the test below
    loader = torch.utils.data.DataLoader(pipe.to_torch_dataset(), batch_size=None, **mp)
    with pytest.raises(ConfigError, match=r"inside DataLoader\(num_workers=W\) use processes=0"):
        next(iter(loader))
    ok = Pipeline(ws, rank=0, world_size=1, lanes=4).map(fns.double).batch(4)
    loader = torch.utils.data.DataLoader(ok.to_torch_dataset(), batch_size=None, **mp)
    assert sum(len(b["id"]) for b in loader) == 200


def test_dataloader_workers_share_the_lanes_and_resume_exactly(root: str) -> None:
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    def rows(batches: Any) -> list[tuple[int, ...]]:
        return [tuple(r) for b in batches for r in b["input_ids"].tolist()]

    alone = rows(DataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None))
    # Workers start with forkserver: forking a test process that has imported other
    # libraries (lance warns it is not fork-safe) is not what a training job should do either.
    mp = {"num_workers": 2, "multiprocessing_context": "forkserver"}
    full = list(StatefulDataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None, **mp))
    assert sorted(rows(full)) == sorted(alone)  # each worker its lanes: all once, none twice
    loader = StatefulDataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None, **mp)
    head = []
    for i, b in enumerate(loader):
        head.append(b)
        if i == 6:
            break
    state = loader.state_dict()
    again = StatefulDataLoader(build(root, 0, 1).to_torch_dataset(), batch_size=None, **mp)
    again.load_state_dict(state)
    assert rows(head) + rows(again) == rows(full)
    with pytest.raises(Exception, match=r"lanes to be a multiple of world_size x num_workers"):
        list(DataLoader(build(root, 0, 1, lanes=3).to_torch_dataset(), batch_size=None, **mp))


def test_a_dataset_read_by_dataloader_workers_never_checkpoints_the_streams_start(
    root: str,
) -> None:
    """With a plain DataLoader and workers, the dataset in the trainer's process has received
    nothing: its state_dict() would restart the stream on resume. It says so instead; read in
    the trainer's process (num_workers=0), its state is what the loop consumed."""
    from torch.utils.data import DataLoader

    mp = {"num_workers": 2, "multiprocessing_context": "forkserver"}
    dataset = build(root, 0, 1).to_torch_dataset()
    fresh = dataset.state_dict()  # before any reading: the start, which is right
    assert all(lane["items"] == 0 for lane in lane_entries(fresh).values())
    loader = iter(DataLoader(dataset, batch_size=None, **mp))
    for _ in range(3):
        next(loader)
    with pytest.raises(ConfigError, match="StatefulDataLoader"):
        dataset.state_dict()
    del loader
    alone = build(root, 0, 1).to_torch_dataset()
    in_process = iter(DataLoader(alone, batch_size=None))
    for _ in range(3):
        next(in_process)
    assert sum(lane["items"] for lane in lane_entries(alone.state_dict()).values()) == 3


def _head(loader: Any, n: int) -> list[Any]:
    head = []
    for i, b in enumerate(loader):
        head.append(b)
        if i == n - 1:
            break
    return head


@pytest.mark.parametrize(
    ("before", "after"), [((2, 2), (1, 1)), ((1, 0), (2, 2)), ((1, 2), (1, 0))]
)
def test_loader_states_restore_with_other_workers_and_ranks(
    root: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    """(ranks, workers) before -> after: every row exactly once, none twice."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from zephon.torch import loader_checkpoint, loader_state

    def rows(batches: Any) -> list[tuple[int, ...]]:
        return [tuple(r) for b in batches for r in b["input_ids"].tolist()]

    def loader(rank: int, world: int, workers: int) -> Any:
        mp = {"num_workers": workers, "multiprocessing_context": "forkserver"} if workers else {}
        return StatefulDataLoader(
            build(root, rank, world).to_torch_dataset(), batch_size=None, **mp
        )

    full = rows(build(root, 0, 1))
    (ranks, workers), (ranks_after, workers_after) = before, after
    seen, states = [], []
    for rank in range(ranks):
        old = loader(rank, ranks, workers)
        seen += rows(_head(old, 3 + rank))
        states.append(old.state_dict())
    checkpoint = loader_checkpoint(*states)
    assert sorted(lane_entries(checkpoint)) == ["0", "1", "2", "3"]
    for rank in range(ranks_after):
        again = loader(rank, ranks_after, workers_after)
        again.load_state_dict(loader_state(checkpoint, workers_after))
        seen += rows(again)
    assert sorted(seen) == sorted(full)
    with pytest.raises(ConfigError, match="snapshot_every_n_steps=1"):
        loader_checkpoint({**loader_state(checkpoint, 2), "_steps_since_snapshot": 2})
    with pytest.raises(ConfigError, match="num_workers must be an int >= 0"):
        loader_state(checkpoint, -1)
    with pytest.raises(ConfigError, match="not a DataLoader state"):
        loader_checkpoint({"model": 1})


def _worker(rank: int, world: int, root: str, init: str, out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    pipe = build(root)  # rank and world size from torch.distributed
    assert (pipe.rank, pipe.world_size) == (rank, world)
    rows = [tuple(r) for b in pipe for r in b["input_ids"].tolist()]
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, rows)
    if rank == 0:  # a file, not a queue: a full pipe would block the child before join()
        Path(out).write_text(json.dumps(gathered))
    dist.barrier()  # no rank tears gloo down while another still works
    dist.destroy_process_group()


def test_torch_distributed_ranks_cover_the_stream_disjointly(root: str, tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    world = 4
    out = str(tmp_path / "gathered.json")
    init = f"file://{tmp_path / 'dist-init'}"
    mp.start_processes(
        _worker, args=(world, root, init, out), nprocs=world, join=True, start_method="spawn"
    )
    gathered = json.loads(Path(out).read_text())
    single = sorted(tuple(r) for b in build(root, 0, 1) for r in b["input_ids"].tolist())
    union = sorted(tuple(r) for rows in gathered for r in rows)
    assert union == single
    assert sum(map(len, gathered)) == len(single)

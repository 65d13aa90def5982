"""Data-parallel coordinates from a torch DeviceMesh, with 4 real gloo processes: as
tp=2 x dp=2, the tensor-parallel peers receive identical batches and the data-parallel groups
disjoint ones; a checkpoint taken there restores as tp=1 x dp=4 (found from an enclosing
``with mesh:``) with every sample exactly once."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402
from zephon.errors import ConfigError  # noqa: E402

pytestmark = pytest.mark.integration
N, HEAD = 400, 5


def build(lanes: int = 4, **where: Any) -> Pipeline:
    ds = Dataset.from_records("rows", [{"i": i} for i in range(N)], samples_per_shard=50)
    ws = StaticMixtureWorkSource([ds], seed=9, shuffle="global", chunk_size=16)
    return Pipeline(ws, lanes=lanes, **where).shuffle(20).batch(4)


def _process(rank: int, world: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    grid = torch.arange(world)
    tp2 = DeviceMesh("cpu", grid.reshape(2, 2), mesh_dim_names=("dp", "tp"))
    pipe = build(device_mesh=tp2)
    it = iter(pipe)
    head = [next(it)["i"].tolist() for _ in range(HEAD)]
    state = pipe.checkpoint()
    it.close()  # type: ignore[attr-defined]
    states: list[Any] = [None] * world
    dist.all_gather_object(states, state)
    tp1 = DeviceMesh("cpu", grid.reshape(4, 1), mesh_dim_names=("dp", "tp"))
    with tp1:  # found without being passed
        again = build()
        again.restore(Pipeline.merge_checkpoints(states))
        rest = [b["i"].tolist() for b in again]
    got: list[Any] = [None] * world
    dist.all_gather_object(got, {"dp": [pipe.dp_rank, again.dp_rank], "head": head, "rest": rest})
    if rank == 0:
        Path(out).write_text(json.dumps(got))
    # Every rank waits for the others before tearing down: a rank that destroyed its group
    # while rank 0 still wrote had gloo abort rank 0 ("terminate called without an active
    # exception", on a loaded machine).
    dist.barrier()
    dist.destroy_process_group()


def test_tensor_parallel_peers_share_batches_and_restore_on_another_mesh(tmp_path: Path) -> None:
    import torch.multiprocessing as mp

    out = str(tmp_path / "got.json")
    init = f"file://{tmp_path / 'init'}"
    mp.start_processes(_process, args=(4, init, out), nprocs=4, join=True, start_method="spawn")
    got = json.loads(Path(out).read_text())
    assert [g["dp"] for g in got] == [[0, 0], [0, 1], [1, 2], [1, 3]]  # rank = dp * tp + tp
    assert got[0]["head"] == got[1]["head"] and got[2]["head"] == got[3]["head"]
    group0 = {i for b in got[0]["head"] for i in b}
    group1 = {i for b in got[2]["head"] for i in b}
    assert not group0 & group1
    rest = [i for g in got for b in g["rest"] for i in b]
    assert sorted([*group0, *group1, *rest]) == list(range(N))


class _Mesh:
    """The part of a DeviceMesh the coordinates read, for the naming rules."""

    def __init__(self, names: tuple[str, ...], shape: tuple[int, ...], at: list[int]) -> None:
        self.mesh_dim_names, self.shape, self._at = names, shape, at

    def get_coordinate(self) -> list[int]:
        return self._at


@pytest.mark.parametrize(
    ("names", "shape", "at", "want"),
    [
        (("dp", "tp"), (2, 4), [1, 3], (1, 2)),
        (("pp", "data_parallel", "tp"), (2, 3, 2), [1, 2, 0], (2, 3)),
        (("dp_replicate", "dp_shard", "tp"), (2, 4, 2), [1, 2, 1], (6, 8)),
        (("dp_shard", "cp", "tp"), (4, 2, 2), [3, 1, 0], (3, 4)),
    ],
)
def test_the_data_parallel_dimensions_of_a_mesh(
    names: tuple[str, ...], shape: tuple[int, ...], at: list[int], want: tuple[int, int]
) -> None:
    from zephon.pipeline.ranks import mesh_coordinates

    assert mesh_coordinates(_Mesh(names, shape, at)) == want
    pipe = build(lanes=want[1], device_mesh=_Mesh(names, shape, at))
    assert (pipe.dp_rank, pipe.dp_size) == want


def test_a_mesh_without_a_data_parallel_dimension_or_given_twice_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"name no data-parallel one.*dp_rank="):
        build(device_mesh=_Mesh(("tp", "pp"), (2, 2), [0, 1]))
    with pytest.raises(ConfigError, match="pass no rank too"):
        build(device_mesh=_Mesh(("dp",), (2,), [0]), rank=0, world_size=2)

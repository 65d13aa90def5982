"""Data-parallel coordinates: under tensor or pipeline parallelism the processes of one group
(same ``dp_rank``) receive the same samples, the groups disjoint ones, and a checkpoint of
``dp_size=2`` restores on ``dp_size=4`` with every sample exactly once."""

from __future__ import annotations

import json

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError

N = 480


def _source() -> StaticMixtureWorkSource:
    ds = Dataset.from_records("rows", [{"i": i} for i in range(N)], samples_per_shard=60)
    return StaticMixtureWorkSource([ds], seed=3, shuffle="global", chunk_size=16)


def _pipe(dp_rank: int, dp_size: int, lanes: int = 4) -> Pipeline:
    return Pipeline(_source(), dp_rank=dp_rank, dp_size=dp_size, lanes=lanes).shuffle(32).batch(4)


def _ids(pipe: Pipeline) -> list[list[int]]:
    return [b["i"].tolist() for b in pipe]


def test_tensor_parallel_peers_get_the_same_batches_and_groups_disjoint_ones() -> None:
    tp, dp = 2, 2
    streams = {}
    for global_rank in range(tp * dp):  # rank = dp_rank * tp + tp_rank
        dp_rank = global_rank // tp
        pipe = _pipe(dp_rank, dp)
        assert (pipe.dp_rank, pipe.dp_size) == (dp_rank, dp)
        streams[global_rank] = _ids(pipe)
    assert streams[0] == streams[1] and streams[2] == streams[3]
    group0 = {i for b in streams[0] for i in b}
    group1 = {i for b in streams[2] for i in b}
    assert not group0 & group1 and group0 | group1 == set(range(N))


def test_a_checkpoint_of_two_groups_restores_on_four_with_every_sample_once() -> None:
    head, states = [], []
    for dp_rank in range(2):
        pipe = _pipe(dp_rank, 2)
        it = iter(pipe)
        head += [i for _ in range(7) for i in next(it)["i"].tolist()]
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()
    merged = Pipeline.merge_checkpoints(states)
    rest = []
    for dp_rank in range(4):
        pipe = _pipe(dp_rank, 4)
        pipe.restore(merged)
        rest += [i for b in _ids(pipe) for i in b]
    assert sorted(head + rest) == list(range(N))


@pytest.mark.parametrize(
    "kwargs",
    [{"dp_rank": 0}, {"dp_size": 2}, {"rank": 1, "world_size": 2, "dp_rank": 0, "dp_size": 2}],
)
def test_data_parallel_coordinates_are_given_once_and_whole(kwargs: dict[str, int]) -> None:
    with pytest.raises(ConfigError, match="dp_rank"):
        Pipeline(_source(), **kwargs)  # type: ignore[arg-type]

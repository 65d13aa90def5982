"""A checkpoint from another curriculum, another dataset version, or corrupted anywhere is a
``StateMismatch`` (or ``ConfigError``) that names what is wrong; never a crash of another
kind, never a silent restart from the stream's start."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephon import Dataset, Pipeline, StateMismatch, StaticMixtureWorkSource
from zephon.errors import ConfigError, ZephonError

N = 120


def _data(root: Path | None = None) -> list[Dataset]:
    if root is None:
        a = Dataset.from_records("a", [{"i": i} for i in range(N)], samples_per_shard=25)
        return [a, Dataset.from_records("b", [{"i": 1000 + i} for i in range(40)])]
    return [Dataset.from_path("a", str(root))]


def build(seed: int = 1, data: list[Dataset] | None = None, lanes: int = 3) -> Pipeline:
    ws = StaticMixtureWorkSource(data or _data(), seed=seed, shuffle="global", chunk_size=8)
    return Pipeline(ws, rank=0, world_size=1, lanes=lanes).shuffle(10, warmup=2).batch(4)


def _state(pipe: Pipeline | None = None, steps: int = 5) -> dict[str, Any]:
    pipe = pipe or build()
    it = iter(pipe)
    for _ in range(steps):
        next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    return state


STATE = _state()


def _set(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(state)
    node = out
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return out


LANE = ("lane_runs", "0", 1)
CORRUPTIONS = {
    "not a dict": ([], "not a Zephon pipeline checkpoint"),
    "version": (_set(STATE, ("zephon_checkpoint",), 99), "not a Zephon pipeline checkpoint"),
    "lane_runs": (_set(STATE, ("lane_runs",), [1, 2]), "lane_runs: not an object"),
    "lane key": (_set(STATE, ("lane_runs", "x"), [[0, 0]]), "is not a lane number"),
    "run": (_set(STATE, ("lane_runs", "0"), {"1": 2}), r"lane_runs\['0'\]: not a list"),
    "entry kind": (_set(STATE, LANE, "here"), r"lane_runs\['0'\]\[1\]: not a lane entry"),
    "entry length": (_set(STATE, LANE, [1, 2, 3]), r"lane_runs\['0'\]\[1\]: not a lane entry"),
    "items": (_set(STATE, (*LANE, 0), -3), r"lane_runs\['0'\]\[1\] items: not a count"),
    "ended": (_set(STATE, (*LANE, 1), "yes"), r"lane_runs\['0'\]\[1\] ended: not a count"),
    "chunk": (_set(STATE, (*LANE, 2), 1.5), r"lane_runs\['0'\]\[1\] chunk: not a count"),
    "counts": (_set(STATE, (*LANE, 4), {"a": 1}), r"lane_runs\['0'\]\[1\] counts: not a list"),
    "ops": (_set(STATE, (*LANE, 5), ["x"]), r"lane_runs\['0'\]\[1\] ops: not a list of states"),
    "op state": (_set(STATE, (*LANE, 5), [[1, 2, 3]]), r"lane_runs\['0'\]\[1\] ops"),
    "lanes": (_set(STATE, ("lanes",), "3"), "checkpoint field lanes"),
    "history": (_set(STATE, ("history",), 7), "history"),
    "ops labels": (_set(STATE, ("ops",), ["shuffle"]), "ops: checkpoint has"),
    "on_error": (_set(STATE, ("on_error",), "skip"), "on_error"),
}


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_a_corrupted_field_is_named(name: str) -> None:
    state, message = CORRUPTIONS[name]
    with pytest.raises(StateMismatch, match=message):
        build().restore(state)


def test_the_object_form_of_an_entry_is_checked_too() -> None:
    entry = {"items": 1, "ended": False, "cursor": {"lane": 1, "chunk": "0"}, "delivered": 2}
    with pytest.raises(StateMismatch, match=r"lane_runs\['0'\]\[1\] cursor chunk: not a count"):
        build().restore(_set(STATE, LANE, {**entry, "ops": [0]}))
    with pytest.raises(StateMismatch, match=r"lane_runs\['0'\]\[1\] residues"):
        build().restore(_set(STATE, LANE, {"items": 0, "ended": False, "residues": 5}))


def test_another_curriculum_is_named() -> None:
    with pytest.raises(StateMismatch, match="seed"):
        build(seed=2).restore(STATE)
    with pytest.raises(StateMismatch, match="shuffle"):
        Pipeline(
            StaticMixtureWorkSource(_data(), seed=1, shuffle="block", chunk_size=8),
            rank=0,
            world_size=1,
            lanes=3,
        ).shuffle(10, warmup=2).batch(4).restore(STATE)


def test_another_dataset_version_is_named(tmp_path: Path) -> None:
    shard = tmp_path / "part-0.jsonl"
    shard.write_text("".join(json.dumps({"i": i}) + "\n" for i in range(60)))
    state = _state(build(data=_data(tmp_path)), steps=3)
    shard.write_text("".join(json.dumps({"i": i + 1}) + "\n" for i in range(60)))  # rewritten
    with pytest.raises(StateMismatch, match=r"dataset 'a'"):
        build(data=_data(tmp_path)).restore(state)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document."""
    out = [at] if at else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


PATHS = _paths(STATE)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**12) | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


@pytest.mark.parametrize("lanes", [3, 2])  # the same lanes, or re-laned
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(path=st.sampled_from(PATHS), value=JSON)
def test_any_corruption_is_refused_or_restores_and_runs(
    lanes: int, path: tuple[Any, ...], value: Any
) -> None:
    """Whatever one value of a checkpoint becomes, the restore refuses it with a Zephon
    error or the pipeline runs (a plausible number read as such); nothing else escapes."""
    state = _set(STATE, path, value)
    pipe = build(lanes=lanes)
    try:
        pipe.restore(state)
        for _ in pipe:
            pass
    except (StateMismatch, ConfigError):
        return
    except ZephonError as exc:  # a run error must still say it is ours
        assert str(exc)


@pytest.mark.parametrize("lanes", [3, 2])
def test_a_huge_lane_count_is_refused_without_counting_its_lanes(lanes: int) -> None:
    """A lane count of 10**12 (corrupt, or hand-edited) names a few missing lanes and stops:
    counting every one of them took 24 GB."""
    state = _set(STATE, ("lanes",), 10**12)
    with pytest.raises(StateMismatch, match=r"lanes \[.*\] and more are missing"):
        build(lanes=lanes).restore(state)

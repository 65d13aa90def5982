"""A restore may change the curriculum's future: a schedule that differs only after the
checkpoint's position, a run extended (more passes, a larger epoch), budgets changed. The run
continues exactly; a schedule that differs where the run has drawn already is refused,
naming the phase."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from zephon import Dataset, MixtureSchedule, Pipeline, StaticMixtureWorkSource
from zephon.errors import StateMismatch

SIZES = {"web": 300, "code": 120, "math": 60}


def _datasets() -> list[Dataset]:
    return [
        Dataset.from_records(name, [{"k": f"{name}{i}"} for i in range(n)], samples_per_shard=25)
        for name, n in SIZES.items()
    ]


def _pipes(mixture: Any, world: int = 1, lanes: int = 2, **kwargs: Any) -> list[Pipeline]:
    source = StaticMixtureWorkSource(_datasets(), mixture, seed=4, chunk_size=8, **kwargs)  # type: ignore[arg-type]
    return [Pipeline(source, rank=r, world_size=world, lanes=lanes) for r in range(world)]


def _take(pipes: list[Pipeline], steps: int | None) -> tuple[list[str], dict[str, Any]]:
    got, states = [], []
    for pipe in pipes:
        it = iter(pipe)
        for n, item in enumerate(it):
            got.append(item["k"])
            if steps is not None and n + 1 == steps:
                break
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    return got, Pipeline.merge_checkpoints(states)


def _resumed(before: Any, after: Any, steps: int, more: int | None, **kwargs: Any) -> list[str]:
    head, state = _take(_pipes(before, **kwargs), steps)
    pipes = _pipes(after, **kwargs)
    for p in pipes:
        p.restore(state)
    rest, _ = _take(pipes, more)
    return head + rest


WARM = (0, {"web": 1, "code": 1})
MAIN = (200, {"web": 3, "code": 1})
ANNEAL = (400, {"web": 1, "math": 1})


def test_a_phase_added_after_the_checkpoint_continues_exactly() -> None:
    """An annealing phase added to an endless run after 150 samples: the resumed run is the
    run that had the phase from the start (nothing drawn differs before it)."""
    later = MixtureSchedule([WARM, MAIN, ANNEAL])
    whole, _ = _take(_pipes(later, stop_after_passes=None), 600)
    got = _resumed(MixtureSchedule([WARM, MAIN]), later, 150, 450, stop_after_passes=None)
    assert got == whole


def test_a_phase_added_to_a_finite_run_draws_the_new_plan_exactly() -> None:
    """The same in a finite run (web capped): the lanes are cut at the checkpoint and what
    the new plan leaves is dealt again: exactly the new plan's samples, each once."""
    later = MixtureSchedule([WARM, MAIN, ANNEAL])
    kwargs: dict[str, Any] = {"max_samples": {"web": 250}, "stop_after_passes": 1}
    whole, _ = _take(_pipes(later, **kwargs), None)
    got = _resumed(MixtureSchedule([WARM, MAIN]), later, 150, None, **kwargs)
    assert Counter(got) == Counter(whole)


def test_a_later_phase_reweighted_after_the_checkpoint_continues_exactly() -> None:
    first = MixtureSchedule([WARM, MAIN, (400, {"web": 1, "code": 3})])
    second = MixtureSchedule([WARM, MAIN, (400, {"web": 1, "math": 3})])
    whole, _ = _take(_pipes(second, stop_after_passes=None), 600)
    got = _resumed(first, second, 300, 300, stop_after_passes=None)
    assert got == whole


def test_a_schedule_changed_before_the_checkpoint_is_refused_naming_the_phase() -> None:
    _, state = _take(_pipes(MixtureSchedule([WARM, MAIN])), 150)
    changed = MixtureSchedule([WARM, (100, {"web": 3, "code": 1})])
    pipe = _pipes(changed)[0]
    with pytest.raises(StateMismatch, match=r"from phase 1 on \(global position 100\)"):
        pipe.restore(state)


@pytest.mark.parametrize("lanes", [(2, 2), (2, 3), (3, 1)])
def test_a_finite_run_extended_on_restore_draws_each_pass_exactly_once(
    lanes: tuple[int, int],
) -> None:
    """One pass planned, two after the restore (with re-laning too): every sample twice."""
    head, state = _take(_pipes(None, lanes=lanes[0], stop_after_passes=1), 200)
    pipes = _pipes(None, lanes=lanes[1], stop_after_passes=2)
    pipes[0].restore(state)
    rest, _ = _take(pipes, None)
    everything = Counter(k for name, n in SIZES.items() for k in (f"{name}{i}" for i in range(n)))
    assert Counter(head + rest) == everything + everything


@pytest.mark.parametrize(("first", "second"), [(300, 500), (500, 300), (300, 300)])
def test_an_epoch_resized_on_restore_ends_at_the_new_size(first: int, second: int) -> None:
    head, state = _take(_pipes(None, epoch_size=first), 100)
    pipes = _pipes(None, epoch_size=second)
    pipes[0].restore(state)
    rest, _ = _take(pipes, None)
    assert len(head + rest) == second
    whole, _ = _take(_pipes(None, epoch_size=second), None)
    assert Counter(head + rest) == Counter(whole) or second < first


def test_a_budget_lowered_below_what_was_drawn_stops_the_dataset_at_once() -> None:
    head, state = _take(_pipes(None, max_samples={"code": 100}), 200)
    pipes = _pipes(None, max_samples={"code": 10})
    pipes[0].restore(state)
    rest, _ = _take(pipes, None)
    drawn = sum(k.startswith("code") for k in head)
    assert drawn > 10
    assert not any(k.startswith("code") for k in rest)
    assert len(set(head + rest)) == len(head + rest)


def test_a_finite_run_made_infinite_is_refused() -> None:
    _, state = _take(_pipes(None, stop_after_passes=1), 50)
    pipe = _pipes(None, stop_after_passes=None)[0]
    with pytest.raises(StateMismatch, match="not make it infinite"):
        pipe.restore(state)

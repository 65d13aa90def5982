"""Batch and pack sizes may change on restore: a checkpoint taken under ``batch(b1)`` or
``pack(L1)`` restores under ``batch(b2)`` / ``pack(L2)`` and goes on with the next sample or
token not yet delivered, in both directions, with re-laning at the same time, and through
several changes in a row; a change that cannot be exact is a ``StateMismatch`` saying why."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import StateMismatch

N = 300


def _source(shuffle: str = "global") -> StaticMixtureWorkSource:
    ds = Dataset.from_records("rows", [{"i": i} for i in range(N)], samples_per_shard=40)
    return StaticMixtureWorkSource([ds], seed=5, shuffle=shuffle, chunk_size=16)  # type: ignore[arg-type]


def _batched(size: int, world: int = 1, lanes: int = 4, drop_last: bool = False) -> list[Pipeline]:
    return [
        Pipeline(_source(), rank=r, world_size=world, lanes=lanes)
        .shuffle(24)
        .batch(size, drop_last)
        for r in range(world)
    ]


def _take(pipes: list[Pipeline], steps: int | None) -> tuple[list[int], dict[str, Any]]:
    """The sample ids of the first ``steps`` batches of each rank (all if None), and the
    joined checkpoint after them, through JSON."""
    got, states = [], []
    for pipe in pipes:
        it = iter(pipe)
        for n, b in enumerate(it):
            got += b["i"].tolist()
            if steps is not None and n + 1 == steps:
                break
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    return got, Pipeline.merge_checkpoints(states)


@pytest.mark.parametrize(("b1", "b2"), [(8, 16), (16, 8), (5, 7), (12, 1)])
def test_batch_size_changes_on_restore_lose_and_repeat_nothing(b1: int, b2: int) -> None:
    head, state = _take(_batched(b1), 3)
    after = _batched(b2)
    after[0].restore(state)
    rest, _ = _take(after, None)
    assert sorted(head + rest) == list(range(N))
    assert len(head) == 3 * b1


def test_batch_size_and_world_size_change_together_then_again() -> None:
    """8 -> 16 with 2 ranks -> 3 ranks, then 16 -> 4 on one rank: each sample once."""
    seen, state = _take(_batched(8, world=2), 4)
    pipes = _batched(16, world=3, lanes=6)
    for p in pipes:
        p.restore(state)
    more, state = _take(pipes, 2)
    last = _batched(4, world=1, lanes=6)
    last[0].restore(state)
    rest, _ = _take(last, None)
    assert sorted(seen + more + rest) == list(range(N))


def test_a_batch_change_keeps_the_sample_order() -> None:
    """In one lane the samples keep their order: only the batch boundaries move. (Lanes are
    merged a batch at a time, so with several the interleaving follows the batch size.)"""
    whole, _ = _take(_batched(8, lanes=1), None)
    head, state = _take(_batched(8, lanes=1), 5)
    after = _batched(3, lanes=1)
    after[0].restore(state)
    rest, _ = _take(after, None)
    assert head + rest == whole


def test_drop_last_may_change_too() -> None:
    head, state = _take(_batched(7, lanes=1), 2)
    after = _batched(7, lanes=1, drop_last=True)
    after[0].restore(state)
    rest, _ = _take(after, None)
    assert len(head + rest) == N - N % 7 and len(set(head + rest)) == len(head + rest)


def _docs(n: int = 120) -> StaticMixtureWorkSource:
    """Document ``i`` has ``i % 29 + 1`` tokens ``1000 * (i + 1) + position``."""
    docs = [{"input_ids": [1000 * (i + 1) + p for p in range(i % 29 + 1)]} for i in range(n)]
    ds = Dataset.from_records("docs", docs, samples_per_shard=20)
    return StaticMixtureWorkSource([ds], seed=2, shuffle="global", chunk_size=8)


def _packed(seq: int, algorithm: str, window: int = 9, lanes: int = 2, world: int = 1):
    return [
        Pipeline(_docs(), rank=r, world_size=world, lanes=lanes).pack_sequences(
            seq, algorithm, window=window
        )
        for r in range(world)
    ]


def _rows(pipes: list[Pipeline], steps: int | None) -> tuple[list[Any], dict[str, Any]]:
    got, states = [], []
    for pipe in pipes:
        it = iter(pipe)
        for n, row in enumerate(it):
            got.append(row)
            if steps is not None and n + 1 == steps:
                break
        states.append(json.loads(json.dumps(pipe.checkpoint())))
        it.close()  # type: ignore[attr-defined]
    return got, Pipeline.merge_checkpoints(states)


def _tokens(rows: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """(document, position) of every real token, checking ids and positions agree."""
    out = []
    for row in rows:
        for t, pos, seg in zip(row["input_ids"], row["positions"], row["segment_ids"], strict=True):
            if seg:
                doc, p = divmod(int(t), 1000)
                assert p == pos
                out.append((doc - 1, p))
    return out


EVERY_TOKEN = sorted((i, p) for i in range(120) for p in range(i % 29 + 1))


@pytest.mark.parametrize("algorithm", ["concat", "best_fit", "first_fit", "best_fit_wrap"])
@pytest.mark.parametrize(("l1", "l2", "w2"), [(16, 40, 9), (40, 16, 9), (24, 24, 4), (16, 7, 30)])
def test_pack_length_changes_on_restore_lose_and_repeat_no_token(
    algorithm: str, l1: int, l2: int, w2: int
) -> None:
    head, state = _rows(_packed(l1, algorithm), 5)
    assert all(len(r["input_ids"]) == l1 for r in head)
    after = _packed(l2, algorithm, window=w2)
    after[0].restore(state)
    rest, _ = _rows(after, None)
    assert all(len(r["input_ids"]) == l2 for r in rest)
    assert sorted(_tokens(head + rest)) == EVERY_TOKEN


@pytest.mark.parametrize("algorithm", ["concat", "best_fit_wrap"])
def test_pack_changes_again_and_again_with_re_laning(algorithm: str) -> None:
    """16 -> 33 (2 ranks -> 1, 2 -> 3 lanes) -> 8 (1 -> 2 ranks): a checkpoint inside a
    re-packed window is taken and restored under a third length."""
    tokens, state = [], None
    plan = [(16, 1, 2, 3), (33, 1, 3, 2), (33, 1, 3, 1), (8, 2, 4, None)]
    for seq, world, lanes, steps in plan:
        pipes = _packed(seq, algorithm, window=11, lanes=lanes, world=world)
        if state is not None:
            for p in pipes:
                p.restore(state)
        rows, state = _rows(pipes, steps)
        tokens += _tokens(rows)
    assert sorted(tokens) == EVERY_TOKEN


def test_a_change_with_a_stateful_step_after_it_is_refused_saying_why() -> None:
    def pipe(seq: int) -> Pipeline:
        return Pipeline(_docs(), rank=0, world_size=1, lanes=2).pack_sequences(seq).shuffle(4)

    first = pipe(8)
    it = iter(first)
    next(it)
    state = first.checkpoint()
    it.close()  # type: ignore[attr-defined]
    with pytest.raises(StateMismatch, match=r"pack\(8.*shuffle.*old units.*restore under"):
        pipe(16).restore(state)


def test_other_changes_are_still_refused() -> None:
    first = _batched(8)[0]
    state = first.checkpoint()
    with pytest.raises(StateMismatch, match="ops: checkpoint has"):
        Pipeline(_source(), rank=0, world_size=1, lanes=4).shuffle(25).batch(8).restore(state)
    forged = {**state, "settings": [None, {"size": "8; rm", "drop_last": False}]}
    with pytest.raises(StateMismatch, match="ops: checkpoint has"):
        _batched(9)[0].restore(forged)


def _v1_pipeline(lanes: int = 4) -> Pipeline:
    """The pipeline ``tests/fixtures/data/checkpoint-v1.json`` was taken from (by a release
    writing version-1 checkpoints: lane entries as objects, no recorded settings)."""
    docs = [{"input_ids": [1000 * (i + 1) + p for p in range(i % 13 + 1)]} for i in range(200)]
    ds = Dataset.from_records("docs", docs, samples_per_shard=25)
    ws = StaticMixtureWorkSource([ds], seed=11, shuffle="global", chunk_size=16)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=lanes).shuffle(30, warmup=4)
    return pipe.pack_sequences(16, "best_fit", window=8).batch(2)


@pytest.mark.parametrize("lanes", [4, 3])
def test_a_version_1_checkpoint_still_restores(lanes: int) -> None:
    from pathlib import Path

    saved = json.loads((Path(__file__).parents[1] / "fixtures/data/checkpoint-v1.json").read_text())
    assert saved["state"]["zephon_checkpoint"] == 1
    whole = [b["input_ids"].tolist() for b in _v1_pipeline()]
    assert saved["head"] == whole[:9]  # the same stream as the release that wrote it
    again = _v1_pipeline(lanes)
    again.restore(saved["state"])
    rest = [b["input_ids"].tolist() for b in again]
    if lanes == 4:
        assert saved["head"] + rest == whole
    ids = sorted(t for b in saved["head"] + rest for row in b for t in row if t)
    assert ids == sorted(t for b in whole for row in b for t in row if t)

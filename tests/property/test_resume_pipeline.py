"""Resume through the public API, explored by hypothesis: datasets of any shape, lanes that
differ from the world size, checkpoints at random cuts restored on another world size and lane
count, merged or per rank. Records carry unique ids, so losses and repeats are visible."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StateMismatch, StaticMixtureWorkSource
from zephon.pipeline.state import lane_entries

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
CHAINS = {
    "plain": lambda p: p,
    "map-filter-batch": lambda p: p.map(fns.double).filter(fns.keep_even).batch(5),
    "batch": lambda p: p.batch(3),
}
# Chains whose operators hold items across a checkpoint: re-laning hands them over.
HOLDING = {
    "shuffle": lambda p: p.shuffle(17),
    "shuffle-first-window-in-parts": lambda p: p.shuffle(40, warmup=3).batch(2),
    "filter-shuffle-map-shuffle-batch": lambda p: (
        p.filter(fns.keep_even).shuffle(11, warmup=2).map(fns.double).shuffle(5).batch(3)
    ),
    "echo-shuffle": lambda p: p.apply(fns.echo_some).shuffle(6),
    "delay": lambda p: p.apply(fns.Delay()).map(fns.undelay),
    "pack-concat": lambda p: p.map(fns.as_tokens).pack(7, pad_id=0),
    "batch-per-dataset": lambda p: p.batch(4, per_dataset=True),
    "filter-ensure-mixture": lambda p: p.filter(fns.keep_even).ensure_mixture(buffer_size=8),
    "shuffle-batch-per-dataset": lambda p: p.shuffle(7).batch(3, per_dataset=True),
    "tokenize-shuffle": lambda p: p.map(fns.as_text).tokenize("bytes").shuffle(13, warmup=3),
    "filter-tokenize-twice-shuffle": lambda p: (
        p.filter(fns.keep_even).map(fns.as_text).tokenize("bytes").tokenize("bytes").shuffle(11)
    ),
    "shuffle-pack-best-fit": lambda p: (
        p.map(fns.as_tokens).shuffle(9).pack(6, algorithm="best_fit", window=5)
    ),
}
ALL = {**CHAINS, **HOLDING}


@st.composite
def collections(draw: st.DrawFn) -> list[Dataset]:
    out = []
    for d in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 400))
        per = draw(st.integers(1, 120))
        records = [{"id": d * 100_000 + i} for i in range(n)]
        out.append(Dataset.from_records(f"d{d}", records, samples_per_shard=per))
    return out


def build(ds: list[Dataset], chain: str, rank: int, world: int, lanes: int, **kw: Any) -> Pipeline:
    ws = StaticMixtureWorkSource(ds, seed=5, chunk_size=32, **kw)
    return ALL[chain](Pipeline(ws, rank=rank, world_size=world, lanes=lanes))


def ids(item: Any) -> list[int]:
    if "segment_ids" in item:  # a packed row: its tokens (padding has segment 0)
        return [int(t) for t in item["input_ids"][item["segment_ids"] > 0]]
    value = item["id"]
    return [int(x) for x in (value.tolist() if hasattr(value, "tolist") else [value])]


async def consume(pipe: Pipeline, limit: int | None) -> list[int]:
    got: list[int] = []
    count = 0
    async for item in pipe:
        got.extend(ids(item))
        count += 1
        if limit is not None and count >= limit:
            break
    return got


def run_phase(
    ds: list[Dataset],
    chain: str,
    world: int,
    lanes: int,
    state: dict[str, Any] | None,
    limits: list[int | None],
    merge: bool,
    **kw: Any,
) -> tuple[list[int], dict[str, Any]]:
    got: list[int] = []
    states = []
    for rank in range(world):
        pipe = build(ds, chain, rank, world, lanes, **kw)
        if state is not None:
            pipe.restore(state)
        got += asyncio.run(consume(pipe, limits[rank]))
        states.append(pipe.checkpoint())
    return got, Pipeline.merge_checkpoints(states) if merge else states[0]


def expected(ds: list[Dataset], chain: str, passes: int = 1) -> Counter[int]:
    out: Counter[int] = Counter()
    for d in ds:
        for r in d.head(d.num_samples):
            i = r["id"]
            if "filter" in chain and i % 2:
                continue
            if chain.startswith("echo"):
                out.update({i: passes} if i % 7 else {})
                out.update({-i - 1: passes} if i % 7 and i % 3 == 0 else {})
            elif "pack" in chain:
                out[i + 1] += (i % 5 + 1) * passes
            else:
                out[i] += passes
    return out


@SETTINGS
@given(
    collections(),
    st.sampled_from(list(CHAINS)),
    st.sampled_from(["none", "block", "global"]),
    st.sampled_from(["repeat", "stop"]),
    st.sampled_from([(1, 1), (2, 1), (3, 3), (4, 2), (6, 2), (5, 1)]),
    st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 3), (6, 3), (4, 4)]),
    st.data(),
)
def test_a_pass_survives_a_cut_restored_on_another_world_and_lane_count(
    ds: list[Dataset],
    chain: str,
    shuffle: str,
    policy: str,
    before: tuple[int, int],
    after: tuple[int, int],
    data: st.DataObject,
) -> None:
    lanes, world = before
    lanes2, world2 = after
    kw = {"shuffle": shuffle, "exhausted_policy": policy}
    limits = [data.draw(st.integers(0, 40)) for _ in range(world)]
    got, state = run_phase(ds, chain, world, lanes, None, limits, merge=True, **kw)
    rest, final = run_phase(ds, chain, world2, lanes2, state, [None] * world2, merge=True, **kw)
    assert Counter(got + rest) == expected(ds, chain)
    assert all(entry["ended"] for entry in lane_entries(final).values())
    again, _ = run_phase(ds, chain, world2, lanes2, final, [None] * world2, merge=True, **kw)
    assert again == []  # a finished run restores to an empty stream


def test_a_rank_refuses_a_state_that_lacks_its_lanes() -> None:
    ds = [Dataset.from_records("x", [{"id": i} for i in range(100)], samples_per_shard=10)]
    pipe = build(ds, "plain", 0, 2, 2)
    asyncio.run(consume(pipe, 5))
    rank0_only = pipe.checkpoint()
    other = build(ds, "plain", 1, 2, 2)
    with pytest.raises(StateMismatch, match=r"lacks lanes \[1\].*merge_checkpoints"):
        other.restore(rank0_only)
    wider = build(ds, "plain", 0, 4, 4)
    with pytest.raises(StateMismatch, match=r"lanes \[1\] are missing.*merge_checkpoints"):
        wider.restore(rank0_only)


@SETTINGS
@given(
    collections(),
    st.sampled_from(list(HOLDING)),
    st.sampled_from(["none", "block", "global"]),
    st.sampled_from([(1, 1), (2, 1), (3, 3), (4, 2), (2, 2)]),
    st.sampled_from([(1, 1), (2, 2), (4, 2), (3, 3), (6, 3), (5, 5)]),
    st.sampled_from([(3, 1), (2, 2), (4, 4), (1, 1)]),
    st.data(),
)
def test_items_held_by_operators_are_handed_over_when_relaning(
    ds: list[Dataset],
    chain: str,
    shuffle: str,
    first: tuple[int, int],
    second: tuple[int, int],
    third: tuple[int, int],
    data: st.DataObject,
) -> None:
    """A shuffle window, a pack row, a stateful apply's buffer: whatever operators hold at a
    checkpoint reaches the consumer exactly once after a restore into other lane counts,
    also when the second checkpoint falls inside a handed-over residue."""
    kw = {"shuffle": shuffle, "exhausted_policy": data.draw(st.sampled_from(["repeat", "stop"]))}
    got: list[int] = []
    state = None
    for lanes, world in (first, second):
        limits = [data.draw(st.integers(0, 30)) for _ in range(world)]
        part, state = run_phase(ds, chain, world, lanes, state, limits, merge=True, **kw)
        got += part
    lanes, world = third
    rest, final = run_phase(ds, chain, world, lanes, state, [None] * world, merge=True, **kw)
    assert Counter(got + rest) == expected(ds, chain)
    assert all(entry["ended"] for entry in lane_entries(final).values())


def test_keeping_the_lanes_keeps_the_order_of_a_shuffled_stream() -> None:
    ds = [Dataset.from_records("x", [{"id": i} for i in range(300)], samples_per_shard=10)]

    def shuffled(lanes: int) -> Pipeline:
        return Pipeline(StaticMixtureWorkSource(ds), rank=0, world_size=1, lanes=lanes).shuffle(50)

    whole = asyncio.run(consume(shuffled(2), None))
    pipe = shuffled(2)
    first = asyncio.run(consume(pipe, 7))
    same = shuffled(2)
    same.restore(pipe.checkpoint())
    assert first + asyncio.run(consume(same, None)) == whole
    wider = shuffled(3)
    wider.restore(pipe.checkpoint())  # the window's items are handed over
    assert sorted(first + asyncio.run(consume(wider, None))) == list(range(300))


@pytest.mark.parametrize("shuffle", ["global", "block"])
def test_resume_is_exact_when_large_records_leave_chunks_in_parts(shuffle: str) -> None:
    """Records of 40 KB under a 4 MiB budget: chunks leave in prefixes as their reads fill
    them. A restore resumes mid-chunk, where cutting the delivered slots off its reads can
    reorder them; the prefixes must still leave in slot order."""
    records = [{"id": i, "pad": "x" * 40_000} for i in range(600)]
    docs = Dataset.from_records("docs", records, samples_per_shard=60)

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource([docs], seed=3, shuffle=shuffle, chunk_size=200)
        return Pipeline(ws, rank=0, world_size=1, fetch_budget_bytes=4 << 20).map(fns.id_of)

    whole = list(build())
    assert sorted(whole) == list(range(600))
    for cut in (7, 130, 333, 450):
        pipe = build()
        it = iter(pipe)
        seen = [next(it) for _ in range(cut)]
        state = json.loads(json.dumps(pipe.checkpoint()))
        it.close()  # type: ignore[attr-defined]
        again = build()
        again.restore(state)
        assert seen + list(again) == whole, cut


@pytest.mark.parametrize("warmup", [0, 16])
def test_a_restore_tokenizes_only_what_its_window_has_left_to_deliver(
    monkeypatch: pytest.MonkeyPatch, warmup: int
) -> None:
    """Tokenize before a shuffle: a restore replays the window from its start, but the items
    of it already delivered pass the tokenizer by (they are skipped anyway). The stream is
    the uninterrupted one at every cut, in order."""
    from zephon.ops import transform
    from zephon.pipeline import steps

    encoded: list[int] = []
    stood_in: list[int] = []
    real_encode, real_plan = transform.tokenize_batch, steps._replay_plan

    def counting(tok: Any, items: list[Any], refs: Any) -> list[Any]:
        encoded.append(len(items))
        return real_encode(tok, items, refs)

    def recording(*args: Any) -> Any:
        plan = real_plan(*args)
        stood_in.append(0 if plan is None else len(plan[1]))
        return plan

    monkeypatch.setattr(transform, "tokenize_batch", counting)
    docs = [Dataset.from_records("d", [{"id": i} for i in range(700)], samples_per_shard=50)]

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource(docs, seed=4, chunk_size=64)
        pipe = Pipeline(ws, rank=0, world_size=1, lanes=2).map(fns.as_text)
        return pipe.tokenize("bytes").shuffle(128, warmup=warmup).pack(9, pad_id=0)

    def rows(pipe: Pipeline, limit: int | None) -> list[list[int]]:
        out = []
        for row in pipe:
            out.append(row["input_ids"].tolist())
            if limit is not None and len(out) >= limit:
                break
        return out

    def resumed(state: dict[str, Any], plan: Any) -> tuple[list[list[int]], int]:
        monkeypatch.setattr(steps, "_replay_plan", plan)
        encoded.clear()
        again = build()
        again.restore(state)
        return rows(again, None), sum(encoded)

    whole = rows(build(), None)
    for cut in (1, 7, 30, 61, 150):
        first = build()
        head = rows(first, cut)
        state = first.checkpoint()
        first.close()
        stood_in.clear()
        tail, fewer = resumed(state, recording)
        assert head + tail == whole, cut
        plain_tail, every = resumed(state, lambda *args: None)  # the replay without stand-ins
        assert plain_tail == tail
        assert fewer == every - sum(stood_in), cut
        assert sum(stood_in) > 0, cut  # each cut falls inside some lane's window


@pytest.mark.parametrize("lanes", [3, 5])
def test_a_restore_starts_its_lanes_in_turn_and_loses_nothing(lanes: int) -> None:
    """After a restore, each lane starts once the one before it (in the merge's order) has a
    block: lanes that have ended, or have nothing left, must not hold the others back."""
    docs = [Dataset.from_records("d", [{"id": i} for i in range(37)], samples_per_shard=5)]

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource(docs, seed=2, chunk_size=4)
        return Pipeline(ws, rank=0, world_size=1, lanes=lanes).shuffle(6, warmup=2)

    assert_exact_at_cuts(build, (1, 9, 30, 36))


def test_a_restore_with_tokenize_in_worker_processes_is_exact() -> None:
    """The stand-ins never cross to a worker: tokenize with ``processes=2`` before a
    shuffle resumes exactly too."""
    docs = [Dataset.from_records("d", [{"id": i} for i in range(300)], samples_per_shard=40)]

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource(docs, seed=6, chunk_size=32)
        pipe = Pipeline(ws, rank=0, world_size=1, lanes=2).map(fns.as_text)
        return pipe.tokenize("bytes", processes=2).shuffle(50, warmup=8)

    assert_exact_at_cuts(build, (3, 77))


def assert_exact_at_cuts(build: Any, cuts: tuple[int, ...]) -> None:
    """Checkpoint a fresh ``build()`` after each of ``cuts`` items, restore it into another
    and check the ids read before and after are the uninterrupted stream."""
    whole = [s["id"] for s in build()]
    for cut in cuts:
        first = build()
        it = iter(first)
        head = [next(it)["id"] for _ in range(cut)]
        state = first.checkpoint()
        first.close()
        again = build()
        again.restore(state)
        assert head + [s["id"] for s in again] == whole, cut

"""Property tests of the planner: a pure function with exact coverage, disjoint lanes, a
bounded mixture, exact coalescing and resume from any cut."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zephon.errors import ConfigError, StateMismatch
from zephon.formats.index import RecordIndex, RowGroupIndex
from zephon.permute import permute, permute_keyed
from zephon.plan import Manifest, StaticMixtureWorkSource

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shuffles = st.sampled_from(["none", "shards", "block", "global"])


def ragged(name: str, sizes: list[int], seed: int) -> Manifest:
    """A manifest of record shards with uneven sample sizes, like a real JSONL dataset."""
    rng = np.random.default_rng(seed)
    layouts = []
    for n in sizes:
        lengths = rng.integers(1, 400, size=n)
        layouts.append(RecordIndex(np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)))
    from zephon.plan.manifest import _Records

    return in_memory(name, f"{name}-{sizes}-{seed}", sizes, [_Records(x) for x in layouts])


def in_memory(name: str, fingerprint: str, sizes: list[int], layouts: list[Any]) -> Manifest:
    """A manifest of ``memory://`` shards with the given per-shard layouts."""
    return Manifest(
        name,
        fingerprint,
        np.array(sizes, dtype=np.int64),
        [f"memory://t/{name}/{i}" for i in range(len(sizes))],
        ["1"] * len(sizes),
        layouts,
    )


manifests = st.lists(st.integers(1, 60), min_size=1, max_size=6)


def stream(ws: StaticMixtureWorkSource, lane: int, lanes: int) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for chunk in ws.chunks(lane, lanes):
        out.extend(
            zip(chunk.datasets.tolist(), chunk.shards.tolist(), chunk.samples.tolist(), strict=True)
        )
    return out


def plain(request: Any) -> Any:
    """A request with its sample, slot and pass arrays as tuples, so requests compare
    with ==."""
    passes = None if request.passes is None else tuple(request.passes.tolist())
    return request._replace(
        samples=tuple(request.samples.tolist()), slots=tuple(request.slots.tolist()), passes=passes
    )


def from_requests(requests: list[Any]) -> list[tuple[int, int, int]]:
    """Rebuild the pointer stream from range requests, by chunk and slot."""
    chunks: dict[int, dict[int, tuple[int, int, int]]] = {}
    for r in requests:
        slots = chunks.setdefault(r.cursor.chunk, {})
        for sample, slot in zip(r.samples, r.slots, strict=True):
            assert slot not in slots
            slots[slot] = (r.dataset, r.shard, sample)
    return [v for c in sorted(chunks) for _, v in sorted(chunks[c].items())]


async def collect(ws: StaticMixtureWorkSource, lane: int, lanes: int, **kw: Any) -> list[Any]:
    return [r async for r in ws.requests(lane, lanes, **kw)]


@given(st.integers(1, 5000), st.integers(0, 2**63 - 1))
def test_permutation_is_a_bijection(n: int, key: int) -> None:
    image = permute(np.arange(n), n, key)
    assert sorted(image.tolist()) == list(range(n))


@given(st.integers(1, 3000), st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=5), st.data())
def test_keyed_permutations_at_once_equal_one_at_a_time(
    n: int, keys: list[int], data: st.DataObject
) -> None:
    which = np.array(data.draw(st.lists(st.integers(0, len(keys) - 1), max_size=200)), np.int64)
    indices = np.array(
        data.draw(st.lists(st.integers(0, n - 1), min_size=len(which), max_size=len(which))),
        np.int64,
    )
    pairs = zip(indices.tolist(), which.tolist(), strict=True)
    expected = [int(permute(np.array([i]), n, keys[w])[0]) for i, w in pairs]
    assert permute_keyed(indices, n, keys, which).tolist() == expected


@SETTINGS
@given(manifests, shuffles, st.integers(0, 1000), st.sampled_from([1, 2, 3]), st.integers(1, 40))
def test_pure_function(sizes: list[int], shuffle: str, seed: int, lanes: int, chunk: int) -> None:
    def build() -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource(
            [ragged("a", sizes, 1), ragged("b", sizes[::-1], 2)],
            seed=seed,
            shuffle=shuffle,
            chunk_size=chunk,
            stop_after_passes=2,
        )

    if sum(sizes) < lanes:
        return
    assert all(
        stream(build(), lane, lanes) == stream(build(), lane, lanes) for lane in range(lanes)
    )


@SETTINGS
@given(
    manifests,
    shuffles,
    st.integers(0, 1000),
    st.integers(1, 4),
    st.integers(1, 3),
    st.integers(1, 50),
)
@example([21], "block", 0, 1, 2, 1)  # one shard, chunk 1: runs once spanned the whole dataset
def test_every_pass_covers_every_sample_once_across_disjoint_lanes_and_is_told(
    sizes: list[int], shuffle: str, seed: int, lanes: int, passes: int, chunk: int
) -> None:
    m = ragged("a", sizes, seed)
    if m.num_samples < lanes:
        return
    ws = StaticMixtureWorkSource(
        [m],
        seed=seed,
        shuffle=shuffle,
        chunk_size=chunk,
        exhausted_policy="stop",
        stop_after_passes=passes,
    )
    everything = [stream(ws, lane, lanes) for lane in range(lanes)]
    all_samples = {(s, i) for s, n in enumerate(sizes) for i in range(n)}
    (split,) = ws.splits(lanes)
    for p in range(passes):  # within every pass: lanes disjoint, together complete, no repeats
        seen: Counter[tuple[int, int]] = Counter()
        for lane, lane_stream in enumerate(everything):
            at = sum(split.share(lane, q) for q in range(p))
            share = split.share(lane, p)
            assert abs(share - m.num_samples / lanes) < 1  # a fair share, every pass
            seen.update((sh, sm) for _, sh, sm in lane_stream[at : at + share])
        assert set(seen) == all_samples and set(seen.values()) == {1}
    for lane in range(lanes):  # each request says the pass of each of its samples
        told = {
            (r.cursor.chunk, slot): p
            for r in asyncio.run(collect(ws, lane, lanes))
            for slot, p in zip(r.slots.tolist(), r.passes.tolist(), strict=True)
        }
        in_order = [told[k] for k in sorted(told)]
        assert in_order == [p for p in range(passes) for _ in range(split.share(lane, p))]
    size = len(everything[0]) // passes
    # A new order per pass, where there are many orders to draw from: a block shuffle of a
    # few runs (4 runs of 5 samples: 24 orders) repeats a pass's order now and then.
    runs = min(ws.block_sizes[0], m.num_samples) // ws.run_sizes[0]
    if shuffle == "block" and m.num_samples >= 8:
        assert runs >= 2  # runs never span a whole block: the order moves them around
    many = shuffle == "global" or (shuffle == "block" and runs >= 10)
    if many and m.num_samples > 20 and lanes == 1 and passes > 1:
        assert everything[0][:size] != everything[0][size : 2 * size]


@SETTINGS
@given(
    st.lists(st.integers(1, 9), min_size=2, max_size=5),
    st.lists(st.integers(20, 200), min_size=5, max_size=5),
    shuffles,
    st.integers(1, 3),
)
def test_every_prefix_is_within_two_of_the_mixture(
    raw_weights: list[int], sizes: list[int], shuffle: str, lanes: int
) -> None:
    k = len(raw_weights)
    ms = [ragged(f"d{i}", [sizes[i]] * 2, i) for i in range(k)]
    mixture = {f"d{i}": w / 7.0 for i, w in enumerate(raw_weights)}
    ws = StaticMixtureWorkSource(
        ms, mixture, shuffle=shuffle, chunk_size=37, stop_after_passes=None
    )
    weights = np.array([float(w) for w in ws.weights])
    for lane in range(lanes):
        picks = []
        for chunk in ws.chunks(lane, lanes):
            picks.extend(chunk.datasets.tolist())
            if len(picks) >= 1500:
                break
        onehot = np.eye(k)[np.array(picks)]
        counts = np.cumsum(onehot, axis=0)
        target = np.arange(1, len(picks) + 1)[:, None] * weights[None, :]
        assert np.abs(counts - target).max() <= 2.0


@SETTINGS
@given(
    manifests,
    shuffles,
    st.integers(1, 3),
    st.integers(1, 64),
    st.integers(0, 4000),
    st.integers(1, 1 << 14),
)
def test_coalesced_requests_cover_exactly_the_samples(
    sizes: list[int], shuffle: str, lanes: int, chunk: int, gap: int, max_bytes: int
) -> None:
    m = ragged("a", sizes, 3)
    if m.num_samples < lanes:
        return
    ws = StaticMixtureWorkSource(
        [m], shuffle=shuffle, chunk_size=chunk, coalesce_gap_bytes=gap, max_request_bytes=max_bytes
    )
    for lane in range(lanes):
        requests = asyncio.run(collect(ws, lane, lanes))
        assert from_requests(requests) == stream(ws, lane, lanes)
        for r in requests:
            offsets = m.layouts[r.shard].offsets
            ((start, stop),) = r.ranges
            picked = np.array(r.samples)
            assert start == offsets[picked].min() and stop == offsets[picked + 1].max()
            spans = sorted(zip(offsets[picked].tolist(), offsets[picked + 1].tolist(), strict=True))
            reached = spans[0][1]
            for a, b in spans[1:]:  # no stretch of unneeded bytes longer than the gap bound
                assert a - reached <= gap
                reached = max(reached, b)
            assert len(set(r.slots)) == len(r.slots)
            assert list(r.slots) == sorted(r.slots)  # curriculum order within a request
            if len(r.samples) > 1:
                assert stop - start <= max_bytes + 400  # bounded (one sample may overflow)


def row_groups(name: str, sizes: list[int], rows: int) -> Manifest:
    """A manifest of Parquet-like shards: row groups of ``rows`` rows are the read units."""
    layouts = []
    for n in sizes:
        starts = np.array([*range(0, n, rows), n], dtype=np.int64)
        groups = len(starts) - 1
        spans = np.arange(groups + 1, dtype=np.int64) * 1000
        chunks = np.stack([spans[:-1], spans[1:]], axis=1).reshape(groups, 1, 2)
        layouts.append(RowGroupIndex(starts, chunks, b"", np.full(groups, 1000, np.int64)))
    return in_memory(name, f"{name}-{sizes}-{rows}", sizes, layouts)


@SETTINGS
@given(
    manifests,
    shuffles,
    st.sampled_from([1, 2, 3]),
    st.integers(1, 40),
    st.sampled_from(["repeat", "stop"]),
    st.integers(1, 9),
    st.integers(2, 7),
    st.sampled_from(["a", "b", "abc"]),
    st.sampled_from([1 << 26, 600]),
)
def test_chunks_planned_together_equal_chunks_planned_one_by_one(
    sizes: list[int],
    shuffle: str,
    lanes: int,
    chunk: int,
    policy: str,
    at_once: int,
    rows: int,
    names: str,
    max_request: int,
) -> None:
    """Also with reads kept within windows of large records (a small ``max_request``): a
    chunk's windows once depended on the mean record size of the chunks planned with it."""
    import zephon.plan.planner as planner

    def plan(count: int) -> list[Any]:
        every = {
            "a": ragged("a", sizes, 1),
            "b": row_groups("b", sizes[::-1], rows),
            "c": ragged("c", [7, 3], 2),
        }
        ws = StaticMixtureWorkSource(
            [every[x] for x in names],
            mixture={"a": 3, "b": 2, "c": 1} if len(names) > 1 else None,
            shuffle=shuffle,
            chunk_size=chunk,
            max_request_bytes=max_request,
            exhausted_policy=policy,
            stop_after_passes=2,
            seed=11,
        )
        saved = planner.CHUNKS_AT_ONCE, planner.PLAN_SLICE_S
        planner.CHUNKS_AT_ONCE, planner.PLAN_SLICE_S = count, 1e9  # groups of ``count``
        try:
            return [
                (
                    c.cursor,
                    c.next_cursor,
                    c.datasets.tolist(),
                    c.shards.tolist(),
                    c.samples.tolist(),
                    [plain(r) for r in c.requests],
                )
                for lane in range(lanes)
                for c in ws.chunks(lane, lanes)
            ]
        finally:
            planner.CHUNKS_AT_ONCE, planner.PLAN_SLICE_S = saved

    if sum(sizes) < lanes:
        return
    one_by_one = plan(1)
    assert one_by_one and plan(at_once) == one_by_one


@SETTINGS
@given(
    manifests,
    shuffles,
    st.integers(1, 40),
    st.integers(1, 9),
    st.sampled_from(["a", "b"]),
    st.integers(0, 600),
    st.sampled_from([None, 1]),
)
def test_pointers_in_storage_order_skip_the_sort_and_plan_the_same_reads(
    sizes: list[int], shuffle: str, chunk: int, rows: int, name: str, gap: int, run: int | None
) -> None:
    import zephon.plan.coalesce as coalesce

    m = ragged("a", sizes, 4) if name == "a" else row_groups("b", sizes, rows)
    passes = 1 if shuffle == "none" else 2  # one pass of storage order: nothing to sort

    def plan() -> list[Any]:
        ws = StaticMixtureWorkSource(
            [m],
            shuffle=shuffle,
            chunk_size=chunk,
            run_size=run,
            stop_after_passes=passes,
            seed=5,
            coalesce_gap_bytes=gap,
            max_request_bytes=2000,
        )
        return [[plain(r) for r in c.requests] for c in ws.chunks()]

    seen: list[bool] = []
    fast = coalesce.in_order

    def spy(keys: Any, within: Any) -> bool:
        seen.append(fast(keys, within))
        return seen[-1]

    coalesce.in_order = spy  # type: ignore[assignment]
    try:
        planned = plan()
        coalesce.in_order = lambda keys, within: False  # type: ignore[assignment]
        sorted_ = plan()
    finally:
        coalesce.in_order = fast
    assert planned == sorted_
    if shuffle == "none":
        assert seen and all(seen)


@SETTINGS
@given(manifests, shuffles, st.sampled_from([1, 2]), st.integers(1, 30), st.data())
def test_resume_from_any_cut_yields_exactly_the_rest(
    sizes: list[int], shuffle: str, lanes: int, chunk: int, data: st.DataObject
) -> None:
    ms = [ragged("a", sizes, 5), ragged("b", [7, 3], 6)]
    if min(m.num_samples for m in ms) < lanes:
        return
    ws = StaticMixtureWorkSource(
        ms, {"a": 2, "b": 1}, shuffle=shuffle, chunk_size=chunk, stop_after_passes=2
    )
    for lane in range(lanes):
        chunks = list(ws.chunks(lane, lanes))
        full = stream(ws, lane, lanes)
        cut = data.draw(st.integers(0, len(full)))
        # the cursor of the chunk holding pointer `cut`, and how far into it the cut is
        seen = 0
        state = None
        for c in chunks:
            if seen + len(c) > cut:
                state = ws.state(c.cursor, cut - seen, lanes)
                break
            seen += len(c)
        if state is None:
            state = ws.state(chunks[-1].next_cursor, 0, lanes) if chunks else None
        rest = from_requests(asyncio.run(collect(ws, lane, lanes, resume=state))) if state else []
        assert rest == full[cut:]


def test_state_is_small_and_json() -> None:
    import json

    ms = [Manifest.uniform("a", 100_000, 10_000), Manifest.uniform("b", 1000, 100)]
    ws = StaticMixtureWorkSource(ms, {"a": 0.9, "b": 0.1}, shuffle="global")
    chunk = next(iter(ws.chunks(0, 8)))
    assert len(json.dumps(ws.state(chunk.next_cursor, 10, 8))) < 2048


def test_restore_into_a_different_source_says_what_differs() -> None:
    a = Manifest.uniform("a", 10, 100)
    ws = StaticMixtureWorkSource([a], seed=1)
    state = ws.state(ws.start(0), 0, 1)
    with pytest.raises(StateMismatch, match="seed: checkpoint has 1, this source has 2"):
        StaticMixtureWorkSource([a], seed=2).check_state(state, 1)
    with pytest.raises(StateMismatch, match="lanes"):
        ws.check_state(state, 2)
    with pytest.raises(StateMismatch, match="datasets"):
        StaticMixtureWorkSource([Manifest.uniform("a", 11, 100)], seed=1).check_state(state, 1)


def test_invalid_arguments_name_themselves() -> None:
    a = Manifest.uniform("a", 2, 5)
    for kwargs, match in [
        ({"shuffle": "random"}, "shuffle"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"exhausted_policy": "loop"}, "exhausted_policy"),
        ({"mixture": {"b": 1.0}}, "mixture names"),
        ({"mixture": {"a": -1}}, "positive"),
        ({"tokens_per_byte": {"a": 0.3}}, "only with mixture_unit"),
        ({"mixture_unit": "tokens", "tokens_per_byte": {"b": 0.3}}, "unknown datasets"),
        ({"stop_after_passes": 0}, "stop_after_passes"),
    ]:
        with pytest.raises(ConfigError, match=match):
            StaticMixtureWorkSource([a], **kwargs)
    tiny = StaticMixtureWorkSource([a])  # fewer samples than lanes: some lanes get none
    drawn = [len(c) for lane in range(16) for c in tiny.chunks(lane, 16)]
    assert sum(drawn) == a.num_samples
    with pytest.raises(ConfigError, match=r"needs tokens_per_byte for \['a'\]"):
        list(StaticMixtureWorkSource([a], mixture_unit="tokens").chunks(0, 1))


def test_token_mixture_balances_tokens_not_samples() -> None:
    short = ragged("short", [200] * 5, 1)
    long_ = Manifest.uniform("long", 5, 200, sample_bytes=4000)
    ws = StaticMixtureWorkSource(
        [short, long_],
        {"short": 1, "long": 1},
        mixture_unit="tokens",
        tokens_per_byte={"short": 0.25, "long": 0.25},
        stop_after_passes=None,
        chunk_size=100,
    )
    tokens = np.zeros(2)
    count = np.zeros(2)
    for i, chunk in enumerate(ws.chunks(0, 1)):
        for d in (0, 1):
            mask = chunk.datasets == d
            nbytes = ws.manifests[d].sample_nbytes(chunk.shards[mask], chunk.samples[mask])
            tokens[d] += nbytes.sum() * 0.25
            count[d] += mask.sum()
        if i == 20:
            break
    assert abs(tokens[0] - tokens[1]) <= 1000  # within one long sample's tokens
    assert count[0] > 5 * count[1]  # so far more short samples


def test_repeat_loops_small_datasets_until_all_complete() -> None:
    big, small = Manifest.uniform("big", 10, 100), Manifest.uniform("small", 1, 50)
    ws = StaticMixtureWorkSource([big, small], {"big": 1, "small": 1}, chunk_size=64)
    picks = np.concatenate([c.datasets for c in ws.chunks(0, 1)])
    assert (picks == 0).sum() == 1000 and (picks == 1).sum() >= 999  # small looped ~20 times
    stop = StaticMixtureWorkSource(
        [big, small], {"big": 1, "small": 1}, chunk_size=64, exhausted_policy="stop"
    )
    picks = np.concatenate([c.datasets for c in stop.chunks(0, 1)])
    assert (picks == 1).sum() == 50 and (picks == 0).sum() in (49, 50, 51)


def test_a_pass_shorter_than_a_chunk_is_still_read_in_runs() -> None:
    # 1,000 images of ~70 KB in 16 shards: the whole pass is one short window, and reads of
    # large records follow the chunk's slot order in windows. Its samples are shuffled by
    # whole runs (dense reads), not one by one.
    from zephon.plan.manifest import _Records

    sizes = [63] * 15 + [55]
    layouts = [_Records(RecordIndex(np.arange(n + 1, dtype=np.int64) * 70_000)) for n in sizes]
    ds = in_memory("images", "images-1000", sizes, layouts)
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="block", chunk_size=1024, run_size=64)
    requests = asyncio.run(collect(ws, 0, 1))
    pointers = from_requests(requests)
    assert sorted(pointers) == sorted(stream(StaticMixtureWorkSource([ds], shuffle="none"), 0, 1))
    assert pointers != sorted(pointers)  # shuffled
    assert len(requests) <= 200  # a read per run piece; one per sample would be ~850


@SETTINGS
@given(st.integers(1, 64), st.sampled_from(["block", "global", "shards"]))
def test_a_read_window_changes_the_reads_never_the_samples(window_mb: int, shuffle: str) -> None:
    from zephon.plan.manifest import _Records

    sizes = [63] * 15 + [55]
    layouts = [_Records(RecordIndex(np.arange(n + 1, dtype=np.int64) * 70_000)) for n in sizes]
    ds = in_memory("images", "images-w", sizes, layouts)
    ws = StaticMixtureWorkSource(
        [ds],
        seed=2,
        shuffle=shuffle,
        chunk_size=256,
        run_size=16,
        max_request_bytes=1 << 20,
        stop_after_passes=2,
    )
    plain_reads = asyncio.run(collect(ws, 0, 1))
    wide = asyncio.run(collect(ws, 0, 1, window_bytes=window_mb << 20))
    assert from_requests(wide) == from_requests(plain_reads) == stream(ws, 0, 1)
    if shuffle == "block" and window_mb >= 4:
        assert len(wide) < len(plain_reads)  # wider windows: longer runs per read

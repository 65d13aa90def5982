"""Property tests of curriculum exactness over the configuration space: any datasets, shard
sizes, weights, lanes, shuffles, policies and passes. A pass delivers every sample exactly
once; any other curriculum delivers exactly its stated global prefix; mixtures stay bounded."""

from __future__ import annotations

from collections import Counter
from fractions import Fraction

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.property.test_planner import in_memory
from zephon.formats.index import RecordIndex
from zephon.plan import Manifest, StaticMixtureWorkSource
from zephon.plan.manifest import _Records

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
Pointer = tuple[int, int, int]


@st.composite
def datasets(draw: st.DrawFn, max_datasets: int = 5, max_samples: int = 5000) -> list[Manifest]:
    """1-5 datasets of 1-5,000 samples in shards of 1-500 samples."""
    out = []
    for d in range(draw(st.integers(1, max_datasets))):
        total = draw(st.integers(1, max_samples))
        per = draw(st.integers(1, 500))
        sizes = [per] * (total // per) + ([total % per] if total % per else [])
        name = f"d{d}"
        layouts = [_Records(RecordIndex(np.arange(n + 1, dtype=np.int64) * 100)) for n in sizes]
        out.append(in_memory(name, f"{name}-{sizes}", sizes, layouts))
    return out


def lane_stream(ws: StaticMixtureWorkSource, lane: int, lanes: int) -> list[Pointer]:
    out: list[Pointer] = []
    for c in ws.chunks(lane, lanes):
        out.extend(zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True))
    return out


def every_sample(ms: list[Manifest], times: int = 1) -> Counter[Pointer]:
    return Counter(
        {
            (d, s, i): times
            for d, m in enumerate(ms)
            for s, n in enumerate(m.shard_samples.tolist())
            for i in range(n)
        }
    )


def global_prefix(ws: StaticMixtureWorkSource) -> Counter[Pointer]:
    """What the curriculum says all lanes deliver together: the first ``c_d`` draws of each
    dataset's multi-pass order."""
    ends = ws.end_counts()
    assert ends is not None
    out: Counter[Pointer] = Counter()
    for d, (m, c) in enumerate(zip(ws.manifests, ends, strict=True)):
        n = m.num_samples
        for p in range(-(-c // n)):
            ranks = np.arange(min(n, c - p * n), dtype=np.int64)
            shards, samples = ws.orders[d].locate(ws.exhaustion.pass_key(d, p), ranks)
            out.update(zip([d] * len(ranks), shards.tolist(), samples.tolist(), strict=True))
    return out


def worst_deviation(picks: list[int], weights: list[Fraction]) -> float:
    """Largest ``|count_d - t * w_d|`` over every prefix ``t`` of a stream of picks."""
    if not picks:
        return 0.0
    arr = np.array(picks)
    t = np.arange(1, len(arr) + 1)
    return max(
        float(np.abs(np.cumsum(arr == d) - t * float(w)).max()) for d, w in enumerate(weights)
    )


def round_robin(streams: list[list[Pointer]]) -> list[Pointer]:
    """Lanes merged one item each in turn, a lane that ended skipped (a rank's merge)."""
    out: list[Pointer] = []
    for i in range(max((len(s) for s in streams), default=0)):
        out.extend(s[i] for s in streams if i < len(s))
    return out


shuffles = st.sampled_from(["none", "shards", "block", "global"])
policies = st.sampled_from(["repeat", "stop"])


@SETTINGS
@given(
    datasets(),
    shuffles,
    policies,
    st.integers(1, 3),
    st.integers(1, 16),
    st.integers(0, 99),
    st.sampled_from([16, 64, 1024]),
)
def test_proportional_passes_deliver_every_sample_exactly_passes_times(
    ms: list[Manifest], shuffle: str, policy: str, passes: int, lanes: int, seed: int, chunk: int
) -> None:
    ws = StaticMixtureWorkSource(
        ms,
        shuffle=shuffle,
        exhausted_policy=policy,
        stop_after_passes=passes,
        seed=seed,
        chunk_size=chunk,
    )
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    delivered = Counter(p for s in streams for p in s)
    assert delivered == every_sample(ms, passes)
    for d, m in enumerate(ms):  # every lane holds a fair share of every dataset
        shares = [sum(1 for p in s if p[0] == d) for s in streams]
        assert max(shares) - min(shares) <= 1, (d, shares)
        assert abs(shares[0] - passes * m.num_samples / lanes) < 1


@SETTINGS
@given(
    datasets(),
    st.lists(st.integers(1, 9), min_size=5, max_size=5),
    shuffles,
    policies,
    st.sampled_from([1, 2, 3, None]),
    st.integers(1, 12),
    st.integers(0, 99),
)
def test_any_weights_deliver_exactly_the_global_prefix(
    ms: list[Manifest],
    raw: list[int],
    shuffle: str,
    policy: str,
    passes: int | None,
    lanes: int,
    seed: int,
) -> None:
    mixture = {m.name: raw[d] for d, m in enumerate(ms)}
    ws = StaticMixtureWorkSource(
        ms,
        mixture,
        shuffle=shuffle,
        exhausted_policy=policy,
        stop_after_passes=passes,
        seed=seed,
        chunk_size=64,
    )
    ends = ws.end_counts()
    if policy == "repeat" and passes is None:
        assert ends is None  # infinite
        return
    assert ends is not None
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    delivered = Counter(p for s in streams for p in s)
    assert delivered == global_prefix(ws)
    sizes = [m.num_samples for m in ms]
    limit = passes or 1
    if policy == "stop":  # ends exactly where the first dataset completes its passes
        assert any(c == limit * n for c, n in zip(ends, sizes, strict=True))
        assert all(c <= limit * n for c, n in zip(ends, sizes, strict=True))
    else:  # every dataset completed its passes, the last one just now
        assert all(c >= limit * n for c, n in zip(ends, sizes, strict=True))
        assert any(c == limit * n for c, n in zip(ends, sizes, strict=True))
    total = sum(ends)
    for c, w in zip(ends, ws.weights, strict=True):  # the end counts follow the weights
        assert abs(c - total * w) <= 1


@SETTINGS
@given(
    datasets(max_samples=3000),
    st.lists(st.integers(1, 9), min_size=5, max_size=5),
    shuffles,
    policies,
    st.sampled_from([1, 2, None]),
    st.sampled_from([1, 2, 4, 8]),
    st.sampled_from([1, 2, 4]),
)
def test_mixture_stays_bounded_per_lane_per_rank_and_globally(
    ms: list[Manifest],
    raw: list[int],
    shuffle: str,
    policy: str,
    passes: int | None,
    lanes: int,
    world: int,
) -> None:
    if lanes % world:
        return
    mixture = {m.name: raw[d] for d, m in enumerate(ms)}
    ws = StaticMixtureWorkSource(
        ms,
        mixture,
        shuffle=shuffle,
        exhausted_policy=policy,
        stop_after_passes=passes,
        chunk_size=64,
    )
    if ws.end_counts() is None:
        ws = StaticMixtureWorkSource(
            ms, mixture, shuffle=shuffle, stop_after_passes=1, chunk_size=64
        )
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    for s in streams:
        assert worst_deviation([p[0] for p in s], ws.weights) <= 2
    per = lanes // world
    for rank in range(world):  # a rank merges its lanes round-robin
        merged = round_robin(streams[rank * per : (rank + 1) * per])
        assert worst_deviation([p[0] for p in merged], ws.weights) <= 2 * per
    merged = round_robin(streams)  # a global step: one item of every lane
    assert worst_deviation([p[0] for p in merged], ws.weights) <= 2 * lanes


def small(name: str, sizes: list[int]) -> Manifest:
    layouts = [_Records(RecordIndex(np.arange(n + 1, dtype=np.int64) * 100)) for n in sizes]
    return in_memory(name, f"{name}-{sizes}", sizes, layouts)


def test_stop_ends_the_curriculum_whatever_stop_after_passes_says() -> None:
    ms = [small("a", [100, 50]), small("b", [300])]
    for passes in (None, 1):
        ws = StaticMixtureWorkSource(ms, exhausted_policy="stop", stop_after_passes=passes)
        assert ws.end_counts() == [150, 300]
        assert Counter(p for lane in range(3) for p in lane_stream(ws, lane, 3)) == (
            every_sample(ms)
        )
    two = StaticMixtureWorkSource(ms, exhausted_policy="stop", stop_after_passes=2)
    assert two.end_counts() == [300, 600]


def test_max_repeats_ends_when_a_dataset_would_start_pass_two_plus_n() -> None:
    ms = [small("a", [100]), small("b", [1000])]
    ws = StaticMixtureWorkSource(ms, {"a": 1, "b": 1}, stop_after_passes=None, max_repeats={"a": 2})
    assert ws.end_counts() == [300, 300]
    streams = [lane_stream(ws, lane, 2) for lane in range(2)]
    delivered = Counter(p for s in streams for p in s)
    assert delivered == global_prefix(ws)
    assert all(delivered[(0, 0, i)] == 3 for i in range(100))  # three passes of a, no fourth
    with_passes = StaticMixtureWorkSource(ms, {"a": 1, "b": 1}, stop_after_passes=1, max_repeats=5)
    assert with_passes.end_counts() == [600, 600]  # a stops b's single pass at its 6th pass


def test_reshuffle_on_repeat_false_keeps_the_order_across_passes() -> None:
    ms = [small("a", [40, 60]), small("b", [500])]
    ws = StaticMixtureWorkSource(
        ms,
        {"a": 1, "b": 1},
        shuffle="global",
        stop_after_passes=1,
        reshuffle_on_repeat={"a": False},
    )
    a = [p for p in lane_stream(ws, 0, 1) if p[0] == 0]
    assert len(a) == 500
    assert a[:100] == a[100:200] == a[400:500]  # every pass of a in one order
    assert sorted(a[:100]) == sorted(every_sample(ms[:1]))
    again = StaticMixtureWorkSource(ms, {"a": 1, "b": 1}, shuffle="global", stop_after_passes=1)
    b = [p for p in lane_stream(again, 0, 1) if p[0] == 0]
    assert b[:100] != b[100:200]  # by default each pass has its own order


def test_invalid_repetition_settings_name_the_conflicting_arguments() -> None:
    import pytest

    from zephon.errors import ConfigError

    ms = [small("a", [10]), small("b", [10])]
    for kwargs, match in [
        (
            {"exhausted_policy": {"a": "stop"}, "max_repeats": {"a": 1}},
            r"max_repeats=1 for 'a' conflicts with exhausted_policy='stop'",
        ),
        ({"exhausted_policy": {"c": "stop"}}, r"exhausted_policy names unknown datasets \['c'\]"),
        ({"max_repeats": -1}, "max_repeats for 'a' must be an int >= 0"),
        ({"reshuffle_on_repeat": {"b": "yes"}}, "reshuffle_on_repeat for 'b' must be a bool"),
        ({"exhausted_policy": {"a": "loop"}}, "exhausted_policy for 'a' must be one of"),
        ({"stop_after_passes": 0}, "stop_after_passes must be an int >= 1 or None"),
        ({"mixture": [0.5, 0.5]}, r"mixture must map dataset names to weights, e.g. \{'a'"),
        ({"mixture": {"a": 1, "c": 1}}, r"unknown \['c'\], missing \['b'\]"),
        ({"mixture": {"a": 1, "b": 0}}, "mixture weights must be positive numbers"),
    ]:
        with pytest.raises(ConfigError, match=match):
            StaticMixtureWorkSource(ms, **kwargs)


def cut_streams(
    ws: StaticMixtureWorkSource, lanes: int, cuts: list[int], history: list[dict] | None = None
) -> tuple[list[Pointer], list[list[int]]]:
    """Every lane's stream up to its cut: the pointers, and each lane's draws per dataset."""
    before: list[Pointer] = []
    drawn = []
    for lane in range(lanes):
        stream: list[Pointer] = []
        for c in ws.chunks(lane, lanes, history=history or ()):
            stream.extend(
                zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True)
            )
            if len(stream) >= cuts[lane]:
                break
        stream = stream[: cuts[lane]]
        before.extend(stream)
        drawn.append([sum(1 for p in stream if p[0] == d) for d in range(len(ws.manifests))])
    return before, drawn


@SETTINGS
@given(
    datasets(max_datasets=3, max_samples=2000),
    st.integers(1, 8),
    st.integers(1, 8),
    st.integers(1, 8),
    st.data(),
    shuffles,
    policies,
    st.integers(1, 2),
)
def test_relaning_delivers_the_rest_exactly_once(
    ms: list[Manifest],
    lanes: int,
    lanes2: int,
    lanes3: int,
    data: st.DataObject,
    shuffle: str,
    policy: str,
    passes: int,
) -> None:
    ws = StaticMixtureWorkSource(
        ms, shuffle=shuffle, exhausted_policy=policy, stop_after_passes=passes, chunk_size=64
    )
    sizes = [len(lane_stream(ws, lane, lanes)) for lane in range(lanes)]
    cuts = [data.draw(st.integers(0, n)) for n in sizes]
    first, drawn = cut_streams(ws, lanes, cuts)
    history = ws.relane(lanes, [], drawn, lanes2)
    sizes2 = [len(lane_stream_h(ws, lane, lanes2, history)) for lane in range(lanes2)]
    cuts2 = [data.draw(st.integers(0, n)) for n in sizes2]
    second, drawn2 = cut_streams(ws, lanes2, cuts2, history)
    history2 = ws.relane(lanes2, history, drawn2, lanes3)  # and once more
    rest = [p for lane in range(lanes3) for p in lane_stream_h(ws, lane, lanes3, history2)]
    assert Counter(first + second + rest) == every_sample(ms, passes)
    for d in range(len(ms)):  # the rest is shared fairly among the new lanes
        shares = [
            sum(1 for p in lane_stream_h(ws, lane, lanes3, history2) if p[0] == d)
            for lane in range(lanes3)
        ]
        assert max(shares) - min(shares) <= 1


def lane_stream_h(
    ws: StaticMixtureWorkSource, lane: int, lanes: int, history: list[dict]
) -> list[Pointer]:
    out: list[Pointer] = []
    for c in ws.chunks(lane, lanes, history=history):
        out.extend(zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True))
    return out


@SETTINGS
@given(
    datasets(max_datasets=3, max_samples=500),
    st.integers(1, 6),
    st.integers(1, 6),
    st.data(),
    shuffles,
)
def test_relaning_an_infinite_curriculum_finishes_the_passes_reached(
    ms: list[Manifest], lanes: int, lanes2: int, data: st.DataObject, shuffle: str
) -> None:
    ws = StaticMixtureWorkSource(ms, shuffle=shuffle, stop_after_passes=None, chunk_size=32)
    horizon = sum(m.num_samples for m in ms) * 2 // lanes + 1
    cuts = [data.draw(st.integers(0, horizon)) for _ in range(lanes)]
    first, drawn = cut_streams(ws, lanes, cuts)
    history = ws.relane(lanes, [], drawn, lanes2)
    splits = ws.splits(lanes2, history)
    for d, m in enumerate(ms):
        reached = splits[d].cutoff + 1  # passes the old lanes had started
        rest: list[Pointer] = []
        for lane in range(lanes2):
            share = splits[d]._rest_share(lane)  # type: ignore[attr-defined]
            mine = [p for p in lane_stream_prefix(ws, lane, lanes2, history, d, share)]
            rest.extend(mine)
        got = Counter(p for p in first + rest if p[0] == d)
        assert got == every_sample([m], reached).__class__(
            {(d, s, i): reached for (_, s, i) in every_sample([m])}
        )


def lane_stream_prefix(
    ws: StaticMixtureWorkSource, lane: int, lanes: int, history: list[dict], d: int, n: int
) -> list[Pointer]:
    """The first ``n`` draws of dataset ``d`` in a lane's (infinite) stream."""
    out: list[Pointer] = []
    if n == 0:
        return out
    for c in ws.chunks(lane, lanes, history=history):
        out.extend(
            p
            for p in zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True)
            if p[0] == d
        )
        if len(out) >= n:
            return out[:n]
    return out


@SETTINGS
@given(
    datasets(max_samples=400),
    st.lists(st.integers(1, 9), min_size=5, max_size=5),
    st.booleans(),
    policies,
    st.sampled_from([1, 2, None]),
    st.integers(1, 12),
    st.integers(0, 11),
    st.floats(0, 1),
)
@example(
    [small("a", [317]), small("b", [5]), small("c", [399])], [1] * 5, False, "repeat", 1, 6, 4, 0.5
)
def test_planning_from_any_cursor_continues_the_same_chunks(
    ms: list[Manifest],
    raw: list[int],
    weighted: bool,
    policy: str,
    passes: int | None,
    lanes: int,
    lane: int,
    where: float,
) -> None:
    mixture = {m.name: raw[d] for d, m in enumerate(ms)} if weighted else None
    ws = StaticMixtureWorkSource(
        ms, mixture, exhausted_policy=policy, stop_after_passes=passes, chunk_size=32
    )
    lane %= lanes
    chunks = []
    for c in ws.chunks(lane, lanes):
        chunks.append(c)
        if len(chunks) > 60:
            break
    if not chunks:
        return
    j = min(len(chunks) - 1, int(where * len(chunks)))
    again = ws.chunks(lane, lanes, chunks[j].cursor)
    for expected_chunk, chunk in zip(chunks[j:], again, strict=False):
        assert chunk.cursor == expected_chunk.cursor
        assert chunk.datasets.tolist() == expected_chunk.datasets.tolist()
        assert chunk.samples.tolist() == expected_chunk.samples.tolist()

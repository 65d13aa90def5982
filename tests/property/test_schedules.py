"""Property tests of mixture schedules, budgets and epochs: what every lane draws, checked
against the plan (end counts), the schedule's global boundaries and the mixture bound, over
datasets, schedules, policies, lanes and shuffles."""

from __future__ import annotations

import math
from collections import Counter
from fractions import Fraction
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.property.test_curriculum import datasets, global_prefix, lane_stream
from zephon import ConfigError, MixtureSchedule, StaticMixtureWorkSource
from zephon.plan import Manifest

SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
shuffles = st.sampled_from(["none", "shards", "block", "global"])


@st.composite
def schedules(draw: st.DrawFn, k: int, longest: int) -> list[tuple[int, dict[str, float]]]:
    """1-4 phases over ``k`` datasets, each dataset drawn in at least one."""
    count = draw(st.integers(1, min(4, longest)))
    starts = [
        0,
        *sorted(draw(st.sets(st.integers(1, longest), min_size=count - 1, max_size=count - 1))),
    ]
    phases = []
    for start in starts:
        weights = draw(st.lists(st.integers(0, 5), min_size=k, max_size=k))
        if not any(weights):
            weights[draw(st.integers(0, k - 1))] = 1
        phases.append((start, {f"d{d}": float(w) for d, w in enumerate(weights) if w}))
    for d in range(k):  # every dataset in some phase
        if not any(f"d{d}" in w for _, w in phases):
            phases[draw(st.integers(0, count - 1))][1][f"d{d}"] = 1.0
    return phases


def lane_starts(phases: list[tuple[int, dict[str, float]]], lane: int, lanes: int) -> list[int]:
    """Where each phase starts in a lane: its share of the global positions before it."""
    return [math.ceil((start - lane) / lanes) if start > lane else 0 for start, _ in phases]


def stretches(picks: list[int], starts: list[int], totals: list[int]):
    """The lane's stretches of constant weights: within a phase, while the datasets it draws
    that the lane has not used up stay the same. Yields ``(phase, live, picks)``."""
    counts = [0] * len(totals)

    def key(t: int) -> tuple[int, tuple[int, ...]]:
        phase = max(i for i, s in enumerate(starts) if s <= t)
        return phase, tuple(d for d in range(len(totals)) if counts[d] < totals[d])

    current, run = key(0), []
    for t, p in enumerate(picks, 1):
        run.append(p)
        counts[p] += 1
        nxt = key(t)
        if nxt != current:
            yield current, run
            current, run = nxt, []
    if run:
        yield current, run


@SETTINGS
@given(
    st.data(),
    datasets(max_datasets=4, max_samples=600),
    shuffles,
    st.sampled_from(["repeat", "stop", "drop"]),
    st.sampled_from([1, 2]),
    st.integers(1, 8),
    st.sampled_from([16, 64]),
)
def test_a_schedule_delivers_its_plan_with_boundaries_and_bounds(
    data: st.DataObject,
    ms: list[Manifest],
    shuffle: str,
    policy: str,
    passes: int,
    lanes: int,
    chunk: int,
) -> None:
    k = len(ms)
    longest = 2 * sum(m.num_samples for m in ms)
    phases = data.draw(schedules(k, longest))
    ws = StaticMixtureWorkSource(
        ms,
        MixtureSchedule(phases),
        shuffle=shuffle,
        exhausted_policy=policy,
        stop_after_passes=passes,
        chunk_size=chunk,
        seed=3,
    )
    ends = ws.end_counts()
    assert ends is not None and all(c is not None for c in ends)
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    # every lane's draws together are exactly the plan: each dataset's first c_d draws of its
    # multi-pass order (so exactly once within every pass)
    assert Counter(p for s in streams for p in s) == global_prefix(ws)
    bound = ws.phases
    for lane, stream in enumerate(streams):
        picks = [p[0] for p in stream]
        totals = [picks.count(d) for d in range(k)]
        starts = lane_starts(phases, lane, lanes)
        for (phase, live), run in stretches(picks, starts, totals):
            weights = [bound[phase].weights[d] if d in live else Fraction(0) for d in range(k)]
            total = sum(weights)
            if total == 0:  # a phase with nothing left: the next one's datasets run on
                continue
            # the phase starts at its global position: nothing it does not draw comes in it
            assert all(weights[p] > 0 for p in run), (lane, phase, run)
            arr = np.array(run)
            t = np.arange(1, len(arr) + 1)
            for d in range(k):
                share = float(weights[d] / total)
                worst = float(np.abs(np.cumsum(arr == d) - t * share).max())
                assert worst <= 2, (lane, phase, d, worst)


@SETTINGS
@given(
    datasets(max_datasets=4, max_samples=400),
    st.lists(st.integers(1, 9), min_size=4, max_size=4),
    st.integers(1, 3000),
    st.integers(1, 8),
    shuffles,
)
def test_an_epoch_is_exactly_its_size_on_any_lanes(
    ms: list[Manifest], raw: list[int], size: int, lanes: int, shuffle: str
) -> None:
    mixture = {m.name: raw[d] for d, m in enumerate(ms)}
    ws = StaticMixtureWorkSource(ms, mixture, epoch_size=size, shuffle=shuffle, chunk_size=16)
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    assert sum(map(len, streams)) == size
    assert Counter(p for s in streams for p in s) == global_prefix(ws)
    total = sum(raw[: len(ms)])
    for d in range(len(ms)):  # each dataset's share of the epoch, within one sample
        got = sum(1 for s in streams for p in s if p[0] == d)
        assert abs(got - size * raw[d] / total) < 1


@SETTINGS
@given(
    datasets(max_datasets=4, max_samples=400),
    st.data(),
    st.sampled_from(["repeat", "stop"]),
    st.integers(1, 8),
)
def test_a_budget_caps_its_dataset_and_the_rest_renormalise(
    ms: list[Manifest], data: st.DataObject, policy: str, lanes: int
) -> None:
    capped = data.draw(st.integers(0, len(ms) - 1))
    cap = data.draw(st.integers(1, 2 * ms[capped].num_samples))
    ws = StaticMixtureWorkSource(
        ms,
        {m.name: 1 for m in ms},
        max_samples={ms[capped].name: cap},
        exhausted_policy=policy,
        chunk_size=16,
    )
    streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
    got = Counter(p[0] for s in streams for p in s)
    assert got[capped] <= cap
    assert Counter(p for s in streams for p in s) == global_prefix(ws)
    if ws.ends().departs[capped]:
        assert got[capped] == cap


def test_drop_is_every_sample_once_the_others_renormalising() -> None:
    ms = [Manifest.uniform("a", 10, 100), Manifest.uniform("b", 2, 50), Manifest.uniform("c", 3, 7)]
    ws = StaticMixtureWorkSource(
        ms, {"a": 1, "b": 1, "c": 1}, exhausted_policy="drop", chunk_size=16
    )
    for lanes in (1, 3, 8):
        streams = [lane_stream(ws, lane, lanes) for lane in range(lanes)]
        flat = [p for s in streams for p in s]
        assert len(flat) == len(set(flat)) == 1000 + 100 + 21
    # one lane: while all three are in, a third each; after c leaves, half each of a and b
    picks = [p[0] for p in lane_stream(ws, 0, 1)]
    first = picks[:60]
    assert all(abs(first.count(d) - 20) <= 1 for d in range(3))
    after_c = picks[picks.index(2, 0) :]
    last_c = max(i for i, d in enumerate(picks) if d == 2)
    window = picks[last_c + 1 : last_c + 101]
    assert 2 not in window and abs(window.count(0) - 50) <= 2, after_c[:5]


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ([], "non-empty"),
        ([(5, {"a": 1})], "start at 0"),
        ([(0, {"a": 1}), (0, {"b": 1})], "increase"),
        ([(0, {"a": -1, "b": 1})], "a number >= 0"),
        ([(0, {"a": 0, "b": 0})], "every weight is 0"),
        ([(0, {"a": 1}), (10, {"zz": 1})], "unknown datasets ['zz']"),
        ([(0, {"a": float("nan")})], "a number >= 0"),
    ],
)
def test_a_bad_schedule_is_a_config_error_naming_it(phases: list, message: str) -> None:
    ms = [Manifest.uniform("a", 2, 10), Manifest.uniform("b", 2, 10)]
    with pytest.raises(ConfigError, match="MixtureSchedule") as err:
        StaticMixtureWorkSource(ms, MixtureSchedule(phases))
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_samples": {"zz": 3}}, "max_samples names unknown datasets ['zz']"),
        ({"max_tokens": {"a": 0}}, "max_tokens for 'a' must be an int >= 1"),
        ({"epoch_size": 0}, "epoch_size must be an int >= 1"),
        ({"exhausted_policy": "all_exhausted"}, "'repeat' with stop_after_passes=1"),
        ({"exhausted_policy": "all_exhausted_without_replacement"}, "exhausted_policy='drop'"),
        ({"mixture": {"a": -1, "b": 1}}, "positive"),
        ({"mixture": {"a": 0, "b": 0}}, "positive"),
    ],
)
def test_bad_budgets_are_config_errors_naming_the_value(kwargs: dict, message: str) -> None:
    ms = [Manifest.uniform("a", 2, 10), Manifest.uniform("b", 2, 10)]
    with pytest.raises(ConfigError) as err:
        StaticMixtureWorkSource(ms, **kwargs)
    assert message in str(err.value)


def test_a_dataset_no_phase_names_is_never_drawn() -> None:
    ms = [Manifest.uniform("a", 2, 10), Manifest.uniform("b", 2, 10)]
    ws = StaticMixtureWorkSource(ms, MixtureSchedule([(0, {"a": 1}), (5, {"a": 2})]))
    assert ws.end_counts() == [20, 0]
    assert {p[0] for p in lane_stream(ws, 0, 1)} == {0}


def token_stream(
    ws: StaticMixtureWorkSource, lane: int, lanes: int, limit: int
) -> list[tuple[int, float]]:
    """A lane's first ``limit`` draws of a token mixture: ``(dataset, estimated tokens)``."""
    ratios = ws._ratios()
    out: list[tuple[int, float]] = []
    for c in ws.chunks(lane, lanes):
        sizes = np.empty(len(c), np.float64)
        for d in np.unique(c.datasets).tolist():
            mask = c.datasets == d
            sizes[mask] = ws.manifests[d].sample_nbytes(c.shards[mask], c.samples[mask]) * ratios[d]
        out += list(zip(c.datasets.tolist(), sizes.tolist(), strict=True))
        if len(out) >= limit:
            break
    return out[:limit]


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.integers(1, 10**6), min_size=10, max_size=10),
    st.lists(st.integers(1, 400), min_size=10, max_size=10),
    st.sampled_from([1e-4, 1e-3, 0.01]),
    st.integers(1, 4),
    st.sampled_from([1, None]),
)
def test_a_tiny_source_keeps_its_token_share_within_one_sequence_on_every_lane(
    sizes: list[int], sample_bytes: list[int], tiny: float, lanes: int, passes: int | None
) -> None:
    """Ten datasets mixed by tokens, one of 1,000 samples at a tiny weight: every prefix of
    every lane holds every dataset within one sequence (its longest sample) of its share."""
    sizes[0] = 1000
    ms = [
        Manifest.uniform(f"d{d}", max(1, n // 100), min(n, 100), b)
        for d, (n, b) in enumerate(zip(sizes, sample_bytes, strict=True))
    ]
    rest = (1 - tiny) / 9
    weights = {"d0": tiny, **{f"d{d}": rest for d in range(1, 10)}}
    ws = StaticMixtureWorkSource(
        ms,
        weights,
        mixture_unit="tokens",
        tokens_per_byte=0.25,
        stop_after_passes=passes,
        chunk_size=64,
    )
    exact = [float(w) for w in ws.weights]
    for lane in range(lanes):
        stream = token_stream(ws, lane, lanes, 3000)
        picks = np.array([d for d, _ in stream])
        tokens = np.array([t for _, t in stream])
        grand = np.cumsum(tokens)
        for d in range(10):
            mine = np.cumsum(np.where(picks == d, tokens, 0.0))
            longest = ms[d].sample_nbytes(np.zeros(1, np.int64), np.zeros(1, np.int64))[0] * 0.25
            worst = float(np.abs(mine - exact[d] * grand).max())
            assert worst <= max(longest, max(tokens)) + 1e-6, (lane, d, worst, longest)


@pytest.mark.parametrize("lanes", [1, 3])
def test_a_token_schedule_changes_phase_at_its_token_position(lanes: int) -> None:
    ms = [Manifest.uniform("web", 50, 100, 400), Manifest.uniform("code", 50, 100, 100)]
    boundary = 60_000  # tokens, all lanes together
    schedule = MixtureSchedule([(0, {"web": 1}), (boundary, {"web": 1, "code": 1})], unit="tokens")
    ws = StaticMixtureWorkSource(
        ms, schedule, tokens_per_byte=0.25, stop_after_passes=None, chunk_size=32
    )
    assert ws.mixture_unit == "tokens"
    total = 0.0
    for lane in range(lanes):
        stream = token_stream(ws, lane, lanes, 2000)
        tokens = np.cumsum([t for _, t in stream])
        first_code = next(i for i, (d, _) in enumerate(stream) if d == 1)
        # the lane's phase starts once it has drawn its share of the boundary's tokens (its
        # first pick is web or code: they are level)
        start = int(np.argmax(tokens >= boundary / lanes)) + 1
        assert first_code in (start, start + 1), (first_code, start)
        total += tokens[start - 1]
        after = stream[first_code:]
        web = sum(t for d, t in after if d == 0)
        code = sum(t for d, t in after if d == 1)
        assert abs(web - code) <= 100  # token shares of the second phase, within a sequence
    assert abs(total - boundary) <= lanes * 100


def selected(m: Manifest, kind: str, seed: int) -> Manifest:
    """``m`` with a selection of its samples: a range or a split part."""
    from zephon.dataset.selection import Everything, Range, SplitPart

    base = Everything(m.shard_samples)
    n = m.num_samples
    sel: Any = (
        Range(base, n // 5, n - n // 7)
        if kind == "range"
        else SplitPart(base, seed, "a", 0, max(1, n * 2 // 3))
    )
    return Manifest(
        m.name,
        f"{m.fingerprint}-{kind}",
        sel.counts.copy(),
        m.uris,
        m.versions,
        m.layouts,
        sel,
        m.shard_samples,
    )


def plan_prefix(ws: StaticMixtureWorkSource) -> Counter[tuple[int, int, int]]:
    """The plan: each dataset's first ``c_d`` draws of its multi-pass order, as samples."""
    out: Counter[tuple[int, int, int]] = Counter()
    for d, (m, c) in enumerate(zip(ws.manifests, ws.end_counts() or [], strict=True)):
        n = m.num_samples
        for p in range(-(-(c or 0) // n)):
            ranks = np.arange(min(n, c - p * n), dtype=np.int64)
            shards, positions = ws.orders[d].locate(ws.exhaustion.pass_key(d, p), ranks)
            samples = m.kept(shards, positions)
            out.update(zip([d] * len(ranks), shards.tolist(), samples.tolist(), strict=True))
    return out


def flat(chunks: list[Any]) -> list[tuple[int, int]]:
    return [p for c in chunks for p in zip(c.datasets.tolist(), c.samples.tolist(), strict=True)]


def streams_of(
    ws: StaticMixtureWorkSource, lanes: int, history: list[dict] | None = None
) -> list[list[tuple[int, int, int]]]:
    out = []
    for lane in range(lanes):
        s: list[tuple[int, int, int]] = []
        for c in ws.chunks(lane, lanes, history=history or []):
            s += list(zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True))
        out.append(s)
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.data(),
    datasets(max_datasets=3, max_samples=400),
    shuffles,
    st.sampled_from(["none", "max_samples", "epoch", "drop"]),
    st.sampled_from(["none", "range", "split"]),
    st.integers(1, 6),
    st.integers(1, 6),
)
def test_schedules_budgets_and_selections_resume_and_relane_at_any_cut(
    data: st.DataObject,
    ms: list[Manifest],
    shuffle: str,
    budget: str,
    selection: str,
    lanes: int,
    lanes2: int,
) -> None:
    """Schedules x budgets x selections x lanes x shuffles: every lane resumes from any of
    its chunks exactly, and a cut at random positions (phase boundaries included) re-laned
    into another lane count draws exactly the plan, each lane a fair share of the rest."""
    ms = [
        selected(m, selection, d) if d == 0 and selection != "none" else m for d, m in enumerate(ms)
    ]
    if any(m.num_samples == 0 for m in ms):
        return
    k = len(ms)
    total = sum(m.num_samples for m in ms)
    phases = data.draw(schedules(k, 2 * total))
    kwargs: dict[str, Any] = {}
    if budget == "max_samples":
        kwargs["max_samples"] = {ms[-1].name: data.draw(st.integers(1, 2 * ms[-1].num_samples))}
    elif budget == "epoch":
        kwargs["epoch_size"] = data.draw(st.integers(1, 2 * total))
    elif budget == "drop":
        kwargs["exhausted_policy"] = "drop"
    ws = StaticMixtureWorkSource(
        ms, MixtureSchedule(phases), shuffle=shuffle, chunk_size=16, seed=5, **kwargs
    )
    streams = streams_of(ws, lanes)
    plan = plan_prefix(ws)
    assert Counter(p for s in streams for p in s) == plan
    # resume from a chunk's cursor: the same rest
    lane = data.draw(st.integers(0, lanes - 1))
    chunks = list(ws.chunks(lane, lanes))
    if chunks:
        j = data.draw(st.integers(0, len(chunks) - 1))
        again = list(ws.chunks(lane, lanes, start=chunks[j].cursor))
        assert flat(again) == flat(chunks[j:])
    # cut every lane at a random position (boundaries drawn on purpose), re-lane, finish
    starts = {math.ceil((b - lane) / lanes) for b, _ in phases for lane in range(lanes)}
    cuts = []
    for s in streams:
        options = st.sampled_from(sorted({min(len(s), max(0, x)) for x in starts} | {0, len(s)}))
        cuts.append(data.draw(st.one_of(st.integers(0, len(s)), options)))
    head = [p for s, c in zip(streams, cuts, strict=True) for p in s[:c]]
    drawn = [
        [sum(1 for p in s[:c] if p[0] == d) for d in range(k)]
        for s, c in zip(streams, cuts, strict=True)
    ]
    history = ws.relane(lanes, [], drawn, lanes2)
    rest = streams_of(ws, lanes2, history)
    assert Counter(head) + Counter(p for s in rest for p in s) == plan
    for d in range(k):
        shares = [sum(1 for p in s if p[0] == d) for s in rest]
        assert max(shares) - min(shares) <= 1


def test_max_tokens_caps_a_dataset_at_its_mean_tokens_per_sample() -> None:
    ms = [Manifest.uniform("web", 10, 100, 400), Manifest.uniform("code", 10, 100, 200)]
    ws = StaticMixtureWorkSource(
        ms, max_tokens={"code": 5_000}, tokens_per_byte=0.25, chunk_size=16
    )
    assert ws.mixture_unit == "samples"
    # code: 200 bytes x 0.25 = 50 tokens a sample -> 100 samples
    assert ws.end_counts() == [1000, 100]
    got = Counter(p[0] for lane in range(3) for p in lane_stream(ws, lane, 3))
    assert got == {0: 1000, 1: 100}
    with pytest.raises(ConfigError, match="max_tokens needs tokens_per_byte"):
        StaticMixtureWorkSource(ms, max_tokens={"code": 5_000}).end_counts()


def test_a_linear_schedule_ramps_the_weights_between_phases() -> None:
    ms = [Manifest.uniform("a", 40, 100), Manifest.uniform("b", 40, 100)]
    schedule = MixtureSchedule([(0, {"a": 1}), (1000, {"b": 1})], interpolate="linear")
    ws = StaticMixtureWorkSource(ms, schedule, stop_after_passes=None, chunk_size=16)
    picks = np.array([p[0] for p in lane_stream_limited(ws, 1200)])
    share_b = [float((picks[i : i + 100] == 1).mean()) for i in range(0, 1000, 100)]
    assert share_b == sorted(share_b) and share_b[0] < 0.1 and share_b[-1] > 0.9
    assert abs(float((picks[:1000] == 1).mean()) - 0.5) < 0.01  # the ramp's mean
    assert (picks[1000:] == 1).all()


def lane_stream_limited(ws: StaticMixtureWorkSource, limit: int) -> list[tuple[int, int, int]]:
    out: list[tuple[int, int, int]] = []
    for c in ws.chunks(0, 1):
        out += list(zip(c.datasets.tolist(), c.shards.tolist(), c.samples.tolist(), strict=True))
        if len(out) >= limit:
            return out[:limit]
    return out

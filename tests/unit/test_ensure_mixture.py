"""ensure_mixture: a filtered stream back to the curriculum's weights within a bounded
buffer, by samples or tokens, exact on resume."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError


def datasets(n: int = 2000) -> list[Dataset]:
    def doc(i: int) -> dict[str, Any]:
        return {"id": i, "input_ids": list(range(i % 7 + 3))}  # 3-9 tokens

    return [
        Dataset.from_records("a", [doc(i) for i in range(n)], samples_per_shard=100),
        Dataset.from_records("b", [doc(100_000 + i) for i in range(n)], samples_per_shard=100),
    ]


def take(pipe: Pipeline, limit: int | None = None) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async for item in pipe:
            got.append(item)
            if limit is not None and len(got) == limit:
                break
        return got

    return asyncio.run(go())


def token_share_of_a(items: list[dict[str, Any]]) -> float:
    tokens = Counter()
    for item in items:
        tokens[item["id"] >= 100_000] += len(item["input_ids"])
    return tokens[False] / (tokens[False] + tokens[True])


def test_token_shares_return_after_a_filter_drops_40_percent_of_one_dataset() -> None:
    ws = StaticMixtureWorkSource(
        datasets(),
        {"a": 0.5, "b": 0.5},
        seed=1,
        shuffle="global",
        mixture_unit="tokens",
        tokens_per_byte={"a": 0.3, "b": 0.3},
        stop_after_passes=None,
    )
    filtered = Pipeline(ws, rank=0, world_size=1, lanes=2).filter(fns.drop_40_percent_of_a)
    before = token_share_of_a(take(filtered, 3000))
    assert before < 0.45  # the filter skews the mixture

    def repaired() -> Pipeline:
        return filtered.ensure_mixture(weight_by="tokens", buffer_size=256, on_surplus="drop")

    pipe = repaired()
    items = take(pipe, 3000)
    assert abs(token_share_of_a(items) - 0.5) < 0.02
    for k in (500, 1000, 2000):  # at every prefix past the buffer's reach
        assert abs(token_share_of_a(items[:k]) - 0.5) < 0.03
    dropped = sum(s.get("dropped", 0) for s in pipe.stats()["stages"].values())
    assert dropped > 0  # counted, as asked
    first = repaired()
    head = take(first, 1234)
    again = repaired()
    again.restore(first.checkpoint())
    assert [x["id"] for x in head + take(again, 3000 - 1234)] == [x["id"] for x in items]


@pytest.mark.parametrize("weight_by", ["samples", "tokens"])
def test_emit_keeps_every_sample_and_resumes_exactly(weight_by: str) -> None:
    def pipe() -> Pipeline:
        ws = StaticMixtureWorkSource(datasets(300), seed=2, shuffle="block")
        return (
            Pipeline(ws, rank=0, world_size=1, lanes=3)
            .filter(fns.drop_40_percent_of_a)
            .ensure_mixture(weight_by, buffer_size=16)
        )

    whole = [x["id"] for x in take(pipe())]
    assert sorted(whole) == sorted(
        i for i in [*range(300), *range(100_000, 100_300)] if i >= 100_000 or i % 5 >= 2
    )
    for cut in (1, 50, 333):
        first = pipe()
        head = [x["id"] for x in take(first, cut)]
        again = pipe()
        again.restore(first.checkpoint())
        assert head + [x["id"] for x in take(again)] == whole


def test_bad_arguments() -> None:
    pipe = Pipeline(StaticMixtureWorkSource(datasets(10)))
    with pytest.raises(ConfigError, match="weight_by"):
        pipe.ensure_mixture(weight_by="bytes")
    with pytest.raises(ConfigError, match="buffer_size"):
        pipe.ensure_mixture(buffer_size=0)


def test_a_cut_anywhere_resumes_exactly() -> None:
    def pipe() -> Pipeline:
        ws = StaticMixtureWorkSource(datasets(40), {"a": 0.3, "b": 0.7}, seed=5, shuffle="global")
        return (
            Pipeline(ws, rank=0, world_size=1)
            .filter(fns.drop_40_percent_of_a)
            .ensure_mixture(buffer_size=4)
        )

    whole = [x["id"] for x in take(pipe())]
    for cut in range(1, len(whole)):
        first = pipe()
        head = [x["id"] for x in take(first, cut)]
        again = pipe()
        again.restore(first.checkpoint())
        assert head + [x["id"] for x in take(again)] == whole, cut


def test_one_tokens_per_byte_ratio_for_every_dataset() -> None:
    def source(ratio: Any) -> StaticMixtureWorkSource:
        return StaticMixtureWorkSource(
            datasets(), {"a": 0.5, "b": 0.5}, seed=1, mixture_unit="tokens", tokens_per_byte=ratio
        )

    assert source(0.25).tokens_per_byte == [0.25, 0.25]  # once a TypeError
    assert source(0.25).fingerprint() == source({"a": 0.25, "b": 0.25}).fingerprint()
    with pytest.raises(ConfigError, match="tokens_per_byte must be a number or"):
        source("0.25")
    with pytest.raises(ConfigError, match="positive"):
        source(0)


def test_ensure_mixture_refuses_a_mixture_schedule() -> None:
    from zephon import ConfigError, Dataset, MixtureSchedule, Pipeline, StaticMixtureWorkSource

    a = Dataset.from_records("a", [{"i": i} for i in range(10)])
    b = Dataset.from_records("b", [{"i": i} for i in range(10)])
    ws = StaticMixtureWorkSource([a, b], MixtureSchedule([(0, {"a": 1, "b": 1}), (5, {"a": 1})]))
    with pytest.raises(ConfigError, match="mixture schedule"):
        Pipeline(ws).ensure_mixture()

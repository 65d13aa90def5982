"""batch(per_dataset=True): every batch from one dataset, datasets in mixture proportion,
exact resume at any cut."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError


def source() -> StaticMixtureWorkSource:
    ds = [
        Dataset.from_records(name, [{"id": k * 10_000 + i} for i in range(n)], samples_per_shard=37)
        for k, (name, n) in enumerate([("a", 600), ("b", 300), ("c", 100)])
    ]
    return StaticMixtureWorkSource(ds, seed=9, shuffle="global")


def take(pipe: Pipeline, limit: int | None = None) -> list[list[int]]:
    async def go() -> list[list[int]]:
        got: list[list[int]] = []
        async for batch in pipe:
            got.append([int(x) for x in batch["id"]])
            if limit is not None and len(got) == limit:
                break
        return got

    return asyncio.run(go())


@pytest.mark.parametrize("lanes", [1, 3])
def test_batches_are_single_dataset_proportional_and_resume_exactly(lanes: int) -> None:
    def pipe() -> Pipeline:
        return (
            Pipeline(source(), rank=0, world_size=1, lanes=lanes)
            .shuffle(11)
            .batch(8, per_dataset=True)
        )

    batches = take(pipe())
    assert sorted(x for b in batches for x in b) == sorted(
        k * 10_000 + i for k, n in enumerate([600, 300, 100]) for i in range(n)
    )
    assert all(len({x // 10_000 for x in b}) == 1 for b in batches)
    full = [b[0] // 10_000 for b in batches if len(b) == 8]
    shares = Counter(full[: len(full) // 2])  # any prefix follows the mixture (0.6/0.3/0.1)
    total = sum(shares.values())
    assert abs(shares[0] / total - 0.6) < 0.1 and abs(shares[2] / total - 0.1) < 0.06
    for cut in (1, 5, 17, 40):
        first = pipe()
        head = take(first, cut)
        again = pipe()
        again.restore(first.checkpoint())
        assert head + take(again) == batches


def test_after_pack_is_refused() -> None:
    ds = Dataset.from_records("t", [{"input_ids": [1, 2, 3]}] * 10, samples_per_shard=5)
    pipe = Pipeline(StaticMixtureWorkSource([ds])).pack(4).batch(2, per_dataset=True)
    with pytest.raises(ConfigError, match="per_dataset"):
        list(pipe)

"""Selecting samples from metadata: take, skip, split, exclude and where. Parts are disjoint
and cover the dataset, do not depend on lanes, ranks or shard layout, counts stay exact, and
bad selections are ConfigErrors naming the dataset, shard and sample."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from zephon import ConfigError, Dataset, Pipeline, StaticMixtureWorkSource
from zephon.dataset.selection import Everything, Excluded, Range, SplitPart
from zephon.errors import StateMismatch

N = 1000


def rows(per_shard: int = 37) -> Dataset:
    return Dataset.from_records("rows", [{"i": i} for i in range(N)], samples_per_shard=per_shard)


def read(ds: Dataset, lanes: int = 1, world: int = 1, shuffle: str = "block") -> list[int]:
    out: list[int] = []
    for rank in range(world):
        ws = StaticMixtureWorkSource([ds], shuffle=shuffle, chunk_size=16, seed=5)  # type: ignore[arg-type]
        out += [x["i"] for x in Pipeline(ws, rank=rank, world_size=world, lanes=lanes)]
    return out


@pytest.mark.parametrize("fractions", [{"train": 0.9, "val": 0.1}, {"a": 0.5, "b": 0.3, "c": 0.2}])
def test_split_parts_are_disjoint_cover_the_dataset_and_are_exact(fractions: dict) -> None:
    parts = rows().split(fractions, seed=7)
    got = {name: read(part) for name, part in parts.items()}
    for name, part in parts.items():
        assert part.num_samples == len(got[name]) == round(fractions[name] * N)
        assert len(set(got[name])) == len(got[name])
    union = Counter(i for ids in got.values() for i in ids)
    assert union == Counter(range(N))


def test_split_does_not_depend_on_lanes_ranks_shuffle_or_shard_layout() -> None:
    want = sorted(read(rows(37).split({"train": 0.8, "val": 0.2}, seed=1)["val"]))
    for per_shard, lanes, world, shuffle in [
        (100, 4, 1, "global"),
        (7, 6, 3, "shards"),
        (1000, 2, 2, "none"),
    ]:
        val = rows(per_shard).split({"train": 0.8, "val": 0.2}, seed=1)["val"]
        assert sorted(read(val, lanes, world, shuffle)) == want
    other = rows(37).split({"train": 0.8, "val": 0.2}, seed=2)["val"]
    assert sorted(read(other)) != want  # the seed chooses


def test_a_part_smaller_than_the_whole_leaves_the_rest_out() -> None:
    parts = rows().split({"val": 0.01})
    assert parts["val"].num_samples == 10


def test_take_skip_and_stacked_selections() -> None:
    ds = rows()
    assert sorted(read(ds.take(5))) == [0, 1, 2, 3, 4]
    assert sorted(read(ds.skip(990))) == list(range(990, 1000))
    assert sorted(read(ds.skip(100).take(50))) == list(range(100, 150))
    assert ds.take(2000).num_samples == N and ds.skip(2000).num_samples == 0
    train = ds.split({"train": 0.5, "val": 0.5}, seed=3)["train"]
    first = train.take(10)
    assert len(read(first)) == 10 and set(read(first)) <= set(read(train))
    assert ds.skip(990).head(3) == [{"i": 990}, {"i": 991}, {"i": 992}]


def test_exclude_by_number_pair_path_and_file(tmp_path: Path) -> None:
    ds = rows(100)
    uri = ds.shards[2].uri
    listing = tmp_path / "dups.jsonl"
    listing.write_text("\n".join(json.dumps(x) for x in [7, [1, 0], [uri, 5]]) + "\n\n")
    for items in ([7, (1, 0), (uri, 5)], [7, [1, 0], [uri[len(ds.root) :], 5]], str(listing)):
        kept = ds.exclude(items)
        assert kept.num_samples == N - 3
        assert sorted(read(kept)) == sorted(set(range(N)) - {7, 100, 205})
    via_path = Dataset.from_path("rows", ds.root, format="jsonl", exclude=[7, 7, 999])
    assert via_path.num_samples == N - 2


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([1000], "exclude names sample 1000, and it has 1000"),
        ([(10, 0)], "exclude names shard 10: no such shard"),
        ([(1, 100)], "exclude names sample 100 of shard"),
        ([("nope.jsonl", 1)], "exclude names shard 'nope.jsonl'"),
        (["x"], "sample numbers or (shard, index) pairs"),
    ],
)
def test_a_bad_exclusion_is_a_config_error_naming_it(items: Any, message: str) -> None:
    with pytest.raises(ConfigError, match="dataset 'rows'") as err:
        rows(100).exclude(items)
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("fractions", "message"),
    [
        ({"a": 0.7, "b": 0.4}, "more than 1"),
        ({"a": 0}, "must be in (0, 1]"),
        ({"a": -0.5}, "must be in (0, 1]"),
        ({}, "split needs"),
    ],
)
def test_a_bad_split_is_a_config_error(fractions: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        rows().split(fractions)
    assert message in str(err.value)


def test_exclude_after_take_is_refused_and_take_needs_a_count() -> None:
    with pytest.raises(ConfigError, match="exclude before take"):
        rows().take(5).exclude([1])
    with pytest.raises(ConfigError, match="take"):
        rows().take(-1)


def test_a_checkpoint_of_one_part_does_not_restore_into_another() -> None:
    parts = rows().split({"train": 0.5, "val": 0.5})
    pipe = Pipeline(StaticMixtureWorkSource([parts["train"]], chunk_size=16))  # type: ignore[list-item]
    it = iter(pipe)
    next(it)
    state = pipe.checkpoint()
    it.close()  # type: ignore[attr-defined]
    other = Pipeline(StaticMixtureWorkSource([parts["val"]], chunk_size=16))  # type: ignore[list-item]
    with pytest.raises(StateMismatch):
        other.restore(state)


def test_planning_memory_is_shards_plus_excluded() -> None:
    """A hundred million samples in 10,000 shards: a range keeps per-shard numbers, an
    exclusion its excluded samples; nothing per kept sample."""
    counts = np.full(10_000, 10_000, np.int64)
    base = Everything(counts)
    window = Range(base, 123, 99_000_000)
    gone = {3: np.array([1, 5, 9]), 9_999: np.array([0])}
    kept = Excluded(window, gone, "x")
    assert int(kept.counts.sum()) == 99_000_000 - 123 - 4
    held = sum(v.nbytes for v in vars(kept).values() if isinstance(v, np.ndarray))
    held += sum(v.nbytes for v in vars(window).values() if isinstance(v, np.ndarray))
    assert held < 1_000_000  # O(shards): two or three numbers per shard
    assert kept.samples(3, np.array([0, 1, 4, 5])).tolist() == [0, 2, 6, 7]
    part = SplitPart(Everything(np.full(100, 10_000, np.int64)), 1, "val", 0, 10_000)
    assert int(part.counts.sum()) == 10_000 and part.counts.nbytes == 800


def write_parquet(folder: Path) -> list[int]:
    for s in range(3):
        ids = list(range(s * 100, s * 100 + 100))
        table = pa.table(
            {"i": ids, "score": [(i * 37 % 100) / 100 for i in ids], "text": ["x" * 64] * 100}
        )
        pq.write_table(table, folder / f"part-{s}.parquet", row_group_size=30)
    return [i for i in range(300) if (i * 37 % 100) / 100 > 0.5]


def test_where_keeps_the_rows_a_parquet_predicate_holds_for_and_caches_them(
    tmp_path: Path,
) -> None:
    want = write_parquet(tmp_path)
    cache = tmp_path / "cache"
    ds = Dataset.from_path("p", str(tmp_path), where=pc.field("score") > 0.5, index_cache=cache)
    assert ds.num_samples == len(want)
    assert sorted(read(ds, lanes=3)) == want
    entries = list((cache / "where").glob("*.npy"))
    assert len(entries) == 3  # one per shard version
    for entry in entries:  # the cache is what the next discovery uses: doctor it
        np.save(entry, np.zeros(0, np.int64))
    again = Dataset.from_path("p", str(tmp_path), where=pc.field("score") > 0.5, index_cache=cache)
    assert again.num_samples == 300
    both = Dataset.from_path(
        "p", str(tmp_path), where=pc.field("score") > 0.5, exclude=[want[0]], index_cache=False
    )
    assert sorted(read(both)) == want[1:]


def test_where_on_jsonl_and_bad_predicates(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text(
        "".join(json.dumps({"i": i, "lang": "en" if i % 3 else "fr"}) + "\n" for i in range(30))
    )
    ds = Dataset.from_path("j", str(tmp_path), where=pc.field("lang") == "fr", index_cache=False)
    assert sorted(read(ds)) == list(range(0, 30, 3))
    with pytest.raises(ConfigError, match=r"pyarrow\.compute expression"):
        Dataset.from_path("j", str(tmp_path), where="lang == 'fr'", index_cache=False)
    with pytest.raises(ConfigError, match="names none of its columns"):
        Dataset.from_path("j", str(tmp_path), where=pc.field("nope") > 1, index_cache=False)

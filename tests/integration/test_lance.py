"""Lance datasets, written by pylance itself: fragments are shards and rows are samples, read
by Lance's own ranged reader, on local disk and on S3 (moto)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.formats.lance import lance_options
from zephon.testing import S3Endpoint

lance = pytest.importorskip("lance")
pa = pytest.importorskip("pyarrow")

pytestmark = pytest.mark.integration

ROWS = 900


def table() -> Any:
    texts = [f"row {i} " * (i % 7 + 1) for i in range(ROWS)]
    return pa.table(
        {"id": list(range(ROWS)), "text": texts, "score": [i / 10 for i in range(ROWS)]}
    )


def write(uri: str, options: dict[str, Any] | None = None) -> None:
    lance.write_dataset(
        table(), uri, max_rows_per_file=250, storage_options=lance_options(uri, options or {})
    )


def ids(pipe: Pipeline) -> list[int]:
    return [int(s["id"]) for s in pipe]


@pytest.mark.parametrize("decode_processes", [0, 2])
def test_every_row_once_in_a_shuffled_pass(tmp_path: Path, decode_processes: int) -> None:
    write(str(tmp_path / "t.lance"))
    ds = Dataset.from_path("t", str(tmp_path / "t.lance"), columns=["id", "text"])
    assert ds.format == "lance" and ds.num_samples == ROWS and len(ds.shards) == 4
    pipe = Pipeline(
        StaticMixtureWorkSource([ds], seed=3, shuffle="global"),
        rank=0,
        world_size=1,
        lanes=2,
        decode_processes=decode_processes,
    )
    out = list(pipe)
    assert sorted(int(s["id"]) for s in out) == list(range(ROWS))
    assert all(set(s) == {"id", "text"} for s in out)  # only the projected columns
    assert out[5]["text"] == table().column("text")[out[5]["id"]].as_py()


def test_a_missing_column_is_a_config_error(tmp_path: Path) -> None:
    write(str(tmp_path / "t.lance"))
    with pytest.raises(ConfigError, match="nope"):
        Dataset.from_path("t", str(tmp_path / "t.lance"), columns=["id", "nope"])


def test_resume_is_exact_and_pinned_to_the_version(tmp_path: Path) -> None:
    uri = str(tmp_path / "t.lance")
    write(uri)
    ds = Dataset.from_path("t", uri)

    def pipe() -> Pipeline:
        ws = StaticMixtureWorkSource([ds], seed=5, shuffle="block")
        return Pipeline(ws, rank=0, world_size=1, lanes=2).shuffle(64, seed=1)

    full = ids(pipe())
    first = pipe()
    it = iter(first)
    head = [int(next(it)["id"]) for _ in range(333)]
    state = json.loads(json.dumps(first.checkpoint()))
    it.close()
    lance.write_dataset(table(), uri, mode="append")  # the dataset grows meanwhile
    again = pipe()
    again.restore(state)
    assert head + ids(again) == full


async def test_a_lance_dataset_on_s3(s3_endpoint: S3Endpoint, s3_bucket: str) -> None:
    uri = f"s3://{s3_bucket}/t.lance"
    options = s3_endpoint.storage_options()
    write(uri, options)
    ds = await Dataset.afrom_path("t", uri, storage_options=options)
    assert ds.num_samples == ROWS
    got = [
        int(s["id"])
        async for s in Pipeline(
            StaticMixtureWorkSource([ds], seed=1), rank=0, world_size=1, lanes=2
        )
    ]
    assert sorted(got) == list(range(ROWS))


def test_where_selects_rows_of_a_lance_dataset_from_a_projected_read(tmp_path: Path) -> None:
    import pyarrow.compute as pc

    write(str(tmp_path / "t.lance"))
    ds = Dataset.from_path(
        "t", str(tmp_path / "t.lance"), where=pc.field("score") >= 45.0, index_cache=False
    )
    assert ds.num_samples == ROWS - 450
    assert sorted(ids(Pipeline(StaticMixtureWorkSource([ds], shuffle="global")))) == list(
        range(450, ROWS)
    )

"""``map(fn, batched=True)`` with Hugging Face ``datasets`` semantics: a dict of lists in,
returned columns merged into the rows, ``remove_columns`` dropped; the same in worker
processes; exact on resume; a wrong result is an error naming the function, the dataset and
the shard's URI."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zephon import ConfigError, Dataset, Pipeline, StaticMixtureWorkSource

N = 120


def texts() -> Dataset:
    return Dataset.from_records("docs", [{"text": "ab" * (i % 9), "i": i} for i in range(N)])


def lengths(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """An HF-style function: columns in, new columns out."""
    return {"n": [len(t) for t in batch["text"]], "text": [t.upper() for t in batch["text"]]}


def pipe(**kwargs: Any) -> Pipeline:
    ws = StaticMixtureWorkSource([texts()], seed=1, shuffle="global", chunk_size=16)  # type: ignore[list-item]
    return Pipeline(ws, lanes=2).map(lengths, batched=True, **kwargs)


@pytest.mark.parametrize("processes", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 7])
def test_returned_columns_are_merged_into_the_rows(processes: int, batch_size: int | None) -> None:
    rows = list(pipe(processes=processes, batch_size=batch_size))
    assert len(rows) == N
    for row in rows:
        assert set(row) == {"text", "i", "n"}
        assert row["text"] == ("AB" * (row["i"] % 9)) and row["n"] == 2 * (row["i"] % 9)


def test_remove_columns_drops_input_columns() -> None:
    rows = list(pipe(remove_columns=["i"]))
    assert all(set(r) == {"text", "n"} for r in rows)
    rows = list(pipe(remove_columns="text"))  # replaced by the function's own "text"
    assert all(
        (set(r) == {"text", "i", "n"} and r["text"].isupper()) or not r["text"] for r in rows
    )


def test_a_batched_map_resumes_exactly() -> None:
    whole = [r["i"] for r in pipe()]
    first = pipe()
    it = iter(first)
    head = [next(it)["i"] for _ in range(50)]
    state = json.loads(json.dumps(first.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    second = pipe()
    second.restore(state)
    assert head + [r["i"] for r in second] == whole


def test_a_wrong_result_names_the_function_dataset_and_shard() -> None:
    ws = StaticMixtureWorkSource([texts()])  # type: ignore[list-item]

    def short(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {"x": batch["i"][:1]}

    with pytest.raises(ValueError, match="'short' returned 1 values of column 'x'") as err:
        list(Pipeline(ws).map(short, batched=True))
    notes = "\n".join(err.value.__notes__)
    assert "dataset 'docs', shard 'memory://zephon-records/docs-" in notes
    assert "dataset #" not in notes

    def not_columns(batch: dict[str, list[Any]]) -> list[int]:
        return [1]

    with pytest.raises(TypeError, match="must return a dict of columns"):
        list(Pipeline(ws).map(not_columns, batched=True))


def test_bad_arguments_are_config_errors() -> None:
    ws = StaticMixtureWorkSource([texts()])  # type: ignore[list-item]

    async def coro(batch: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return batch

    with pytest.raises(ConfigError, match="plain function"):
        Pipeline(ws).map(coro, batched=True)
    with pytest.raises(ConfigError, match="apply with batched=True"):
        Pipeline(ws).map(lengths, remove_columns=["i"])
    with pytest.raises(ConfigError, match="batch_size"):
        Pipeline(ws).map(lengths, batched=True, batch_size=0)

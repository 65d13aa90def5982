"""Where a read is decoded in the pipeline's process: a large read of a codec whose decoding
releases the GIL (Arrow's Parquet reader) is decoded on a thread, so the event loop keeps
receiving; small reads and pure-Python codecs stay on the loop; and lanes decoding one
Parquet dataset at once stay correct."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.formats.jsonl import JsonlCodec
from zephon.formats.parquet import ParquetCodec
from zephon.pipeline import graph


def _threads(monkeypatch: pytest.MonkeyPatch, codec: type) -> list[str]:
    """Names of the threads ``codec.decode`` runs on, from now on."""
    seen: list[str] = []
    original = codec.decode

    def decode(self: Any, *args: Any) -> Any:
        seen.append(threading.current_thread().name)
        return original(self, *args)

    monkeypatch.setattr(codec, "decode", decode)
    return seen


def _parquet(root: Path) -> list[int]:
    root.mkdir()
    for s in range(3):
        ids = list(range(s * 600, s * 600 + 600))
        table = pa.table({"i": ids, "t": [f"row {i} " * 40 for i in ids]})
        pq.write_table(table, root / f"p{s}.parquet", row_group_size=100)
    return list(range(1800))


def test_large_parquet_reads_decode_off_the_loop_and_jsonl_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(graph, "OFF_LOOP_BYTES", 1)  # every read counts as large
    expected = _parquet(tmp_path / "pq")
    (tmp_path / "j").mkdir()
    (tmp_path / "j" / "a.jsonl").write_text("".join(json.dumps({"i": i}) + "\n" for i in range(50)))
    on_parquet = _threads(monkeypatch, ParquetCodec)
    on_jsonl = _threads(monkeypatch, JsonlCodec)
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    ws = StaticMixtureWorkSource([ds], shuffle="block", chunk_size=64, seed=2, stop_after_passes=1)
    assert sorted(s["i"] for s in Pipeline(ws, lanes=1)) == expected
    lines = Dataset.from_path("j", str(tmp_path / "j"), index_cache=False)
    got = Pipeline(StaticMixtureWorkSource([lines], stop_after_passes=1), lanes=1)
    assert sorted(s["i"] for s in got) == list(range(50))
    assert on_parquet and "zephon-loop" not in on_parquet
    assert on_jsonl and set(on_jsonl) == {"zephon-loop"}


def test_small_parquet_reads_decode_on_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    expected = _parquet(tmp_path / "pq")  # row groups of ~25 KB
    on_parquet = _threads(monkeypatch, ParquetCodec)
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    ws = StaticMixtureWorkSource([ds], shuffle="block", chunk_size=64, seed=2, stop_after_passes=1)
    assert sorted(s["i"] for s in Pipeline(ws, lanes=1)) == expected
    assert on_parquet and set(on_parquet) == {"zephon-loop"}


def test_lanes_decoding_one_parquet_dataset_at_once_get_their_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four lanes share the codec and its kept row groups, each decoding on its own thread:
    every row exactly once, in each lane's planned order."""
    monkeypatch.setattr(graph, "OFF_LOOP_BYTES", 1)
    expected = _parquet(tmp_path / "pq")
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    ws = StaticMixtureWorkSource([ds], shuffle="block", chunk_size=16, seed=5, stop_after_passes=1)
    together = [s["i"] for s in Pipeline(ws, lanes=4)]
    assert sorted(together) == expected
    ws_again = StaticMixtureWorkSource(
        [ds], shuffle="block", chunk_size=16, seed=5, stop_after_passes=1
    )
    assert [s["i"] for s in Pipeline(ws_again, lanes=4)] == together  # deterministic order

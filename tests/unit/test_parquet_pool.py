"""Parquet row groups are decoded with their own allocator (jemalloc or the C library's), not
Arrow's default one, and selected columns come back as pyarrow would give them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.formats import parquet


def _write(root: Path) -> list[dict[str, Any]]:
    root.mkdir()
    rows = [
        {"i": i, "text": f"row {i} " * 200, "meta": {"a": i, "b": [i, -i]}, "z": float(i)}
        for i in range(3000)
    ]
    pq.write_table(pa.Table.from_pylist(rows), root / "p.parquet", row_group_size=1000)
    return rows


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    parquet.decode_pool.cache_clear()
    yield
    parquet.decode_pool.cache_clear()


def test_row_groups_are_decoded_outside_arrows_default_pool(
    tmp_path: Path, fresh_pool: Any
) -> None:
    rows = _write(tmp_path / "pq")
    pool = parquet.decode_pool()
    assert pool.backend_name in ("jemalloc", "system")
    default = pa.default_memory_pool()
    assert default.backend_name != pool.backend_name
    baseline = default.bytes_allocated()
    seen: list[tuple[int, int]] = []

    def probe(sample: dict[str, Any]) -> dict[str, Any]:
        seen.append((pool.bytes_allocated(), default.bytes_allocated() - baseline))
        return sample

    ds = Dataset.from_path("pq", str(tmp_path / "pq"), index_cache=False)
    for shuffle in ("block", "global"):  # rows picked in runs, and one by one (a copy)
        ws = StaticMixtureWorkSource([ds], shuffle=shuffle, seed=3, stop_after_passes=1)
        got = list(Pipeline(ws, lanes=1).map(probe))
        assert sorted(s["i"] for s in got) == [r["i"] for r in rows]
    # A decoded row group (1,000 rows of 1.4 KB of text) lives in the decode pool...
    assert min(held for held, _ in seen) > 1_000_000
    # ...and never in Arrow's default one.
    assert max(extra for _, extra in seen) < 100_000


def test_selected_columns_come_in_the_order_asked_nested_ones_whole(
    tmp_path: Path, fresh_pool: Any
) -> None:
    _write(tmp_path / "pq")
    columns = ["z", "meta", "i"]
    expected = pq.read_table(tmp_path / "pq" / "p.parquet", columns=columns).to_pylist()
    ds = Dataset.from_path("pq", str(tmp_path / "pq"), columns=columns, index_cache=False)
    ws = StaticMixtureWorkSource([ds], stop_after_passes=1)
    got = sorted(Pipeline(ws, lanes=1), key=lambda s: s["i"])
    assert got == expected
    assert all(list(s) == columns for s in got)
    assert got[7]["meta"] == {"a": 7, "b": [7, -7]}


def test_a_pool_named_in_the_environment_is_arrows_default(
    monkeypatch: pytest.MonkeyPatch, fresh_pool: Any
) -> None:
    monkeypatch.setenv("ARROW_DEFAULT_MEMORY_POOL", "system")
    parquet.decode_pool.cache_clear()
    assert parquet.decode_pool().backend_name == pa.default_memory_pool().backend_name

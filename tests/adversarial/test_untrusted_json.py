"""JSON inside data files is untrusted: nesting too deep for the parser, and counts that are not
counts (``Infinity``, ``2.5``, ``-1``, ``true``), are a ``FormatError`` naming the dataset and
the file (and the sample, for records), never a ``RecursionError`` or ``OverflowError`` that
``on_error="skip"`` cannot absorb. Coverage-guided fuzzing found the first of these in the MDS
index; these tests cover every place Zephon parses JSON it did not write."""

from __future__ import annotations

import json
import re
import shutil
import struct
from pathlib import Path

import pytest

from tests.formatdata import FIXTURES
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import FormatError

DEEP = "[" * 100_000 + "]" * 100_000
NOT_COUNTS = [float("inf"), float("nan"), 2.5, -1, True, "many", [3]]


def _pipe(ds: Dataset, **options: object) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="none", stop_after_passes=1)
    return Pipeline(ws, rank=0, world_size=1, **options)  # type: ignore[arg-type]


def test_a_jsonl_record_nested_too_deeply(tmp_path: Path) -> None:
    lines = [json.dumps({"i": i}) for i in range(10)]
    lines[4] = '{"i": 4, "x": ' + DEEP + "}"
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    ds = Dataset.from_path("deep", str(tmp_path), index_cache=False)
    with pytest.raises(FormatError, match="nested too deeply") as caught:
        list(_pipe(ds))
    assert "'deep'" in str(caught.value) and "a.jsonl" in str(caught.value)
    assert caught.value.sample == 4
    pipe = _pipe(ds, on_error="skip")
    assert [r["i"] for r in pipe] == [0, 1, 2, 3, 5, 6, 7, 8, 9]
    assert len(pipe.stats()["skipped"]) == 1


def _mds_copy(root: Path) -> dict[str, object]:
    shutil.copytree(FIXTURES / "mds", root)
    index: dict[str, object] = json.loads((root / "index.json").read_text())
    return index


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
@pytest.mark.parametrize("field", ["samples", "raw_data.bytes", "column_sizes"])
def test_an_mds_index_with_a_count_that_is_not_one(
    tmp_path: Path, field: str, value: object
) -> None:
    index = _mds_copy(tmp_path / "mds")
    entry = index["shards"][3]  # type: ignore[index]
    if field == "samples":
        entry["samples"] = value
    elif field == "raw_data.bytes":
        entry["raw_data"]["bytes"] = value
    else:
        entry["column_sizes"][2] = value
    (tmp_path / "mds" / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=re.escape(field) + " must") as caught:
        Dataset.from_path("mosaic", str(tmp_path / "mds"), index_cache=False)
    assert "'mosaic'" in str(caught.value) and "index.json" in str(caught.value)


def test_an_mds_index_nested_too_deeply(tmp_path: Path) -> None:
    _mds_copy(tmp_path / "mds")
    (tmp_path / "mds" / "index.json").write_text('{"version": 2, "shards": ' + DEEP + "}")
    with pytest.raises(FormatError, match="nested too deeply") as caught:
        Dataset.from_path("mosaic", str(tmp_path / "mds"), index_cache=False)
    assert "index.json" in str(caught.value)


def _mds_shard(samples: list[bytes]) -> bytes:
    """An MDS shard of one variable-size column: count, offsets, then (size, value) each."""
    bodies = [struct.pack("<I", len(s)) + s for s in samples]
    header = 4 + 4 * (len(bodies) + 1)
    offsets = [header]
    for body in bodies:
        offsets.append(offsets[-1] + len(body))
    counts = struct.pack(f"<I{len(offsets)}I", len(bodies), *offsets)
    return counts + b"".join(bodies)


def test_an_mds_json_column_nested_too_deeply(tmp_path: Path) -> None:
    root = tmp_path / "mds"
    root.mkdir()
    values = [json.dumps({"i": i}).encode() for i in range(5)]
    values[2] = DEEP.encode()
    shard = _mds_shard(values)
    (root / "shard.00000.mds").write_bytes(shard)
    entry = {
        "format": "mds",
        "version": 2,
        "samples": 5,
        "compression": None,
        "zip_data": None,
        "column_names": ["meta"],
        "column_encodings": ["json"],
        "column_sizes": [None],
        "raw_data": {"basename": "shard.00000.mds", "bytes": len(shard)},
    }
    (root / "index.json").write_text(json.dumps({"version": 2, "shards": [entry]}))
    ds = Dataset.from_path("mosaic", str(root), index_cache=False)
    assert [s["meta"] for s in _pipe(ds, on_error="skip")] == [{"i": i} for i in (0, 1, 3, 4)]
    with pytest.raises(FormatError, match="nested too deeply") as caught:
        list(_pipe(ds))
    assert caught.value.sample == 2 and "shard.00000.mds" in str(caught.value)


def _litdata_copy(root: Path) -> dict[str, object]:
    shutil.copytree(FIXTURES / "litdata", root)
    index: dict[str, object] = json.loads((root / "index.json").read_text())
    return index


@pytest.mark.parametrize("value", NOT_COUNTS, ids=repr)
@pytest.mark.parametrize("field", ["chunk_size", "chunk_bytes"])
def test_a_litdata_index_with_a_count_that_is_not_one(
    tmp_path: Path, field: str, value: object
) -> None:
    index = _litdata_copy(tmp_path / "lit")
    index["chunks"][2][field] = value  # type: ignore[index]
    (tmp_path / "lit" / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match=field + " must") as caught:
        Dataset.from_path("lit", str(tmp_path / "lit"), index_cache=False)
    assert "'lit'" in str(caught.value) and "index.json" in str(caught.value)


@pytest.mark.parametrize(
    "spec",
    [
        DEEP,
        json.dumps([1, {"type": "builtins.list", "children_spec": [5]}]),
        json.dumps([1, {"type": "os.system", "children_spec": []}]),
        json.dumps([1, {"type": "builtins.dict", "context": '["a"]', "children_spec": []}]),
        json.dumps([1, {"type": None}]),  # one leaf where data_format has several
        json.dumps([1, {"type": "builtins.list", "children_spec": "ab"}]),
    ],
    ids=["deep", "leaf-not-a-node", "unknown-node", "dict-keys", "leaf-count", "children-str"],
)
def test_a_litdata_data_spec_the_decoder_cannot_walk(tmp_path: Path, spec: str) -> None:
    index = _litdata_copy(tmp_path / "lit")
    index["config"]["data_spec"] = spec  # type: ignore[index]
    (tmp_path / "lit" / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError) as caught:
        Dataset.from_path("lit", str(tmp_path / "lit"), index_cache=False)
    assert "'lit'" in str(caught.value)


def test_a_litdata_data_spec_nested_past_the_bound(tmp_path: Path) -> None:
    index = _litdata_copy(tmp_path / "lit")
    leaves = len(index["config"]["data_format"])  # type: ignore[index]
    node: dict[str, object] = {
        "type": "builtins.list",
        "children_spec": [{"type": None}] * leaves,
    }
    for _ in range(100):
        node = {"type": "builtins.list", "children_spec": [node]}
    index["config"]["data_spec"] = json.dumps([1, node])  # type: ignore[index]
    (tmp_path / "lit" / "index.json").write_text(json.dumps(index))
    with pytest.raises(FormatError, match="at most 64 levels"):
        Dataset.from_path("lit", str(tmp_path / "lit"), index_cache=False)


@pytest.mark.parametrize("value", NOT_COUNTS[:3], ids=repr)
def test_a_persistent_index_with_a_count_that_is_not_one(tmp_path: Path, value: float) -> None:
    from zephon.cli import main

    shutil.copytree(FIXTURES / "mds", tmp_path / "mds")
    assert main(["index", str(tmp_path / "mds")]) == 0
    path = tmp_path / "mds" / "_zephon_index.json"
    index = json.loads(path.read_text())
    index["shards"][0]["num_samples"] = value
    path.write_text(json.dumps(index))
    with pytest.raises(FormatError, match="corrupt persistent index") as caught:
        Dataset.from_path("mosaic", str(tmp_path / "mds"), index_cache=False)
    assert "_zephon_index.json" in str(caught.value)

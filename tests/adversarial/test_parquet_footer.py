"""Damaged Parquet footers: indexing one gives an index or a ``ValueError`` (which discovery
turns into a FormatError), and reading the rows gives rows or a FormatError; the process is
never ended. pyarrow's accessor for a column chunk's metadata used to end it on some footers
(an uncaught C++ exception), so every single-byte damage of a real footer is tried, each run
in a child process so that such an end is reported instead of ending the test run."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.formatdata import write_parquet
from zephon import Dataset
from zephon.errors import FormatError
from zephon.formats.parquet import footer_length, index_from_footer
from zephon.formats.thrift import read_struct

SWEEP = """
import sys
from pathlib import Path
from zephon.formats.parquet import footer_length, index_from_footer
data = Path(sys.argv[1]).read_bytes()
footer = data[-footer_length(data[-8:], len(data)):]
for at in range(len(footer) - 8):
    for mask in (0x01, 0x3F, 0x80, 0xFF):
        damaged = footer[:at] + bytes([footer[at] ^ mask]) + footer[at + 1:]
        try:
            index_from_footer(damaged, len(data), None)
        except ValueError:
            pass
print("swept", len(footer) - 8)
"""


@pytest.mark.timeout(300)
def test_every_single_byte_damage_of_a_footer_indexes_or_raises(tmp_path: Path) -> None:
    write_parquet(tmp_path / "data", shards=1)
    shard = next((tmp_path / "data").glob("*.parquet"))
    run = subprocess.run(
        [sys.executable, "-c", SWEEP, str(shard)], capture_output=True, text=True, timeout=280
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith("swept")


def test_the_footer_that_ended_the_process_now_reads_as_a_format_error(tmp_path: Path) -> None:
    """The damage found by fuzzing (pyarrow 26): a list field header (0x29) in a column
    chunk's metadata turned into an i64 one (0x16), which leaves a level histogram of the
    wrong length. Every such change gives all rows or a FormatError naming the shard."""
    root = tmp_path / "data"
    write_parquet(root, shards=1)
    shard = next(root.glob("*.parquet"))
    data = shard.read_bytes()
    footer_at = len(data) - footer_length(data[-8:], len(data))
    hits = 0
    for at in range(footer_at, len(data) - 8):
        if data[at] != 0x29:  # field delta 2, type list: size statistics' histograms
            continue
        damaged = data[:at] + bytes([0x16]) + data[at + 1 :]
        shard.write_bytes(damaged)
        try:
            ds = Dataset.from_path("pq", str(root), index_cache=False)
            rows = ds.head(ds.num_samples)
        except FormatError as exc:
            assert "pq" in str(exc) and shard.name in str(exc)
            hits += 1
        else:
            assert len(rows) == ds.num_samples
    shard.write_bytes(data)
    assert hits > 0  # the family the fuzzer found is present in this pyarrow's footers


@pytest.mark.parametrize(
    "options", [{}, {"use_dictionary": False}, {"compression": "zstd"}, {"write_page_index": True}]
)
def test_offsets_read_from_the_thrift_match_pyarrow(options: dict[str, object]) -> None:
    n = 2000
    table = pa.table(
        {
            "id": np.arange(n),
            "word": [f"w{i % 7}" for i in range(n)],
            "pair": [[i, i + 1] for i in range(n)],
            "image": [{"bytes": b"\0" * (i % 50), "path": None} for i in range(n)],
        }
    )
    out = io.BytesIO()
    pq.write_table(table, out, row_group_size=300, **options)  # type: ignore[arg-type]
    data = out.getvalue()
    footer = data[-footer_length(data[-8:], len(data)) :]
    index = index_from_footer(footer, len(data), ["word", "image"])
    md = pq.ParquetFile(pa.BufferReader(data)).metadata
    expected = []
    for g in range(md.num_row_groups):
        for c in (1, 3, 4):  # word, image.bytes, image.path
            col = md.row_group(g).column(c)
            start = col.data_page_offset
            if col.has_dictionary_page and col.dictionary_page_offset:
                start = min(start, col.dictionary_page_offset)
            expected.append([start, start + col.total_compressed_size])
    assert index.chunks.reshape(-1, 2).tolist() == expected
    assert index.row_starts.tolist() == [min(g * 300, n) for g in range(8)]


@given(st.binary(max_size=200))
def test_thrift_reader_raises_value_error_or_parses(data: bytes) -> None:
    try:
        fields = read_struct(data)
    except ValueError:
        return
    assert isinstance(fields, dict)


def test_thrift_reader_refuses_a_list_longer_than_its_bytes() -> None:
    with pytest.raises(ValueError, match="longer than the data"):
        read_struct(bytes([0x19, 0xF6, 0xFF, 0xFF, 0xFF, 0x0F]))  # field 1: list of 2**32 i64

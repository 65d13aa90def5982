"""Parquet: the footer gives row counts and where every column chunk lies, so a row group's
selected columns are read with a handful of range requests and nothing else.

This module reads footers without pyarrow (their Thrift, see ``thrift``): discovery in a
trainer whose DataLoader workers decode never loads it (tens of megabytes in every process
that does). Decoding with Arrow is ``parquet_arrow``, imported on a codec's first decode.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.formats.blob import Blob
from zephon.formats.codec import BaseCodec
from zephon.formats.index import RowGroupIndex
from zephon.formats.thrift import read_struct
from zephon.refs import ShardInfo

__all__ = [
    "MAGIC",
    "MissingColumns",
    "ParquetCodec",
    "footer_length",
    "index_from_footer",
    "leaf_fields",
]

MAGIC = b"PAR1"
# A footer's row counts are believed up to this: pyarrow allocates for every declared row
# before it finds fewer. A row takes at least a bit in some column, except in runs of one
# value (RLE: a constant or all-null column), hence the generous floor.
MAX_GROUP_ROWS = 1 << 24
ROWS_PER_BYTE = 512


def footer_length(tail: bytes, shard_size: int) -> int:
    """Bytes of footer (metadata + 8) announced by the last 8 bytes of the file.

    Raises ``ValueError`` if the file does not end like a Parquet file.
    """
    if len(tail) < 8 or tail[-4:] != MAGIC:
        raise ValueError("no PAR1 magic at the end of the file")
    meta_len = int(struct.unpack("<I", tail[-8:-4])[0])
    if meta_len + 12 > shard_size:
        raise ValueError(f"footer length {meta_len} exceeds the file size {shard_size}")
    return meta_len + 8


class MissingColumns(ValueError):
    """Requested columns that a Parquet file does not have."""


def _column_indices(names: list[str], columns: Sequence[str] | None) -> list[int]:
    """The leaf columns (``names``: each one's top-level field) that hold ``columns``."""
    if columns is None:
        return list(range(len(names)))
    wanted = set(columns)
    missing = sorted(wanted - set(names))
    if missing:
        raise MissingColumns(f"columns {missing} not in the file (has {sorted(set(names))})")
    return [c for c, name in enumerate(names) if name in wanted]


def index_from_footer(
    footer: bytes, shard_size: int, columns: Sequence[str] | None
) -> RowGroupIndex:
    """The :class:`RowGroupIndex` of a shard from its raw footer (the last ``footer_length``
    bytes). Raises ``ValueError`` if the footer does not parse or places a column chunk
    outside the file.

    Everything is read from the footer's Thrift: the schema (which top-level field each
    leaf column belongs to) and the row groups' sizes and offsets."""
    meta = read_struct(footer[:-8])
    names = leaf_fields(meta)
    cols = _column_indices(names, columns)
    groups = _row_groups(meta, len(names))
    chunks = np.zeros((len(groups), len(cols), 2), dtype=np.int64)
    rows = np.zeros(len(groups) + 1, dtype=np.int64)
    data_end = shard_size - len(footer)
    for g, (num_rows, metas) in enumerate(groups):
        rows[g + 1] = rows[g] + num_rows
        group_bytes = sum(m[1] - m[0] for m in map(_chunk_span, metas))
        if num_rows > max(MAX_GROUP_ROWS, ROWS_PER_BYTE * group_bytes):
            raise ValueError(
                f"corrupt Parquet footer: row group {g} declares {num_rows:,} rows in "
                f"{group_bytes:,} bytes (decoding would allocate for every one)"
            )
        for j, c in enumerate(cols):
            start, stop = _chunk_span(metas[c])
            if not len(MAGIC) <= start <= stop <= data_end:
                raise ValueError(
                    f"corrupt Parquet footer: row group {g} column {c} spans bytes "
                    f"{start}-{stop}, outside the data (4-{data_end})"
                )
            chunks[g, j] = (start, stop)
    nbytes = (chunks[:, :, 1] - chunks[:, :, 0]).sum(axis=1) if len(cols) else np.zeros(len(groups))
    return RowGroupIndex(rows, chunks, bytes(footer), nbytes.astype(np.int64))


def leaf_fields(meta: dict[int, Any]) -> list[str]:
    """The top-level field of each leaf column, in column order, from a footer's schema: a
    depth-first list of elements (FileMetaData: 2 = schema), the root first, each group
    followed by its ``num_children`` (SchemaElement: 5) children; 4 = name, 1 = a leaf's type
    (one of 8), 3 = repetition (one of 3)."""
    elements = _field(meta, 2, list, "schema")
    if not elements:
        raise ValueError("corrupt Parquet footer: an empty schema")
    open_groups = [_children(elements[0], len(elements))]  # children left at each depth
    fields: list[str] = []
    top = ""
    for element in elements[1:]:
        if not open_groups:
            raise ValueError("corrupt Parquet footer: schema elements past the root's children")
        name = _field(element, 4, bytes, "field name")
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError("corrupt Parquet footer: a field name is not UTF-8") from None
        if element.get(3, 0) not in range(3):
            raise ValueError(f"corrupt Parquet footer: field {text!r} has no valid repetition")
        if len(open_groups) == 1:
            top = text
        open_groups[-1] -= 1
        children = _children(element, len(elements))
        if children:
            open_groups.append(children)
        else:
            if _field(element, 1, int, f"type of field {text!r}") not in range(8):
                raise ValueError(f"corrupt Parquet footer: field {text!r} has no valid type")
            fields.append(top)
        while open_groups and open_groups[-1] == 0:
            open_groups.pop()
    if open_groups:
        raise ValueError("corrupt Parquet footer: the schema ends inside a group")
    return fields


def _children(element: Any, most: int) -> int:
    children = element.get(5, 0) if isinstance(element, dict) else None
    if not isinstance(children, int) or isinstance(children, bool) or not 0 <= children < most:
        raise ValueError("corrupt Parquet footer: a schema group with no valid child count")
    return children


def _row_groups(meta: dict[int, Any], num_columns: int) -> list[tuple[int, list[dict[int, Any]]]]:
    """``(num_rows, [ColumnMetaData fields])`` of each row group in a footer's Thrift
    (FileMetaData: 4 = row_groups)."""
    out = []
    for group in _field(meta, 4, list, "row groups"):
        num_rows = _field(group, 3, int, "a row group's row count")  # RowGroup: 1 = columns
        metas = [
            _field(chunk, 3, dict, "column metadata") for chunk in _field(group, 1, list, "columns")
        ]
        if num_rows < 0 or len(metas) != num_columns:
            raise ValueError(
                f"corrupt Parquet footer: a row group of {num_rows} rows, {len(metas)} columns"
            )
        out.append((num_rows, metas))
    return out


def _chunk_span(meta: dict[int, Any]) -> tuple[int, int]:
    """Byte range of a column chunk: from its dictionary page (when there is one, before the
    data pages; some writers store 0 for none) or first data page, ``total_compressed_size``
    long. ColumnMetaData: 7 = total_compressed_size, 9 = data_page_offset, 11 = dictionary."""
    start = _field(meta, 9, int, "data page offset")
    dictionary = meta.get(11)
    if isinstance(dictionary, int) and 0 < dictionary < start:
        start = dictionary
    return start, start + _field(meta, 7, int, "compressed size")


def _field(struct_: Any, key: int, kind: type, what: str) -> Any:
    value = struct_.get(key) if isinstance(struct_, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ValueError(f"corrupt Parquet footer: no valid {what}")
    return value


class ParquetCodec(BaseCodec):
    """Decodes Parquet rows. Each sample is a ``dict`` of the selected columns of one row.

    Args:
        dataset: dataset name, for errors.
        columns: top-level columns to read; ``None`` reads all.
    """

    format = "parquet"
    takes_arrays = True  # ``samples`` may be an int64 array: picking rows is numpy work
    # Arrow decodes without the GIL: a large read (pipeline.graph.OFF_LOOP_BYTES) is decoded
    # off the event loop, which meanwhile receives the next row groups
    # (docs/architecture.md). Lanes may then decode at once: the lock makes one decoder.
    releases_gil = True

    def __init__(self, dataset: str, columns: Sequence[str] | None = None) -> None:
        self.dataset = dataset
        self.columns = tuple(columns) if columns is not None else None
        self._decoder: Any = None  # a parquet_arrow.Decoder, made by the first decode
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "columns": self.columns}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["dataset"], state["columns"])  # type: ignore[misc]

    def decode(
        self, shard: ShardInfo, index: RowGroupIndex, blob: Blob, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        if len(samples) == 0:
            return []
        decoder = self._decoder
        if decoder is None:
            from zephon.formats.parquet_arrow import Decoder  # pyarrow: on first use

            with self._lock:
                if self._decoder is None:
                    self._decoder = Decoder(self.dataset, self.columns)
                decoder = self._decoder
        out: list[dict[str, Any]] = decoder.decode(shard, index, blob, samples)
        return out

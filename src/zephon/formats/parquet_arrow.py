"""Parquet rows decoded with Arrow: the half of the format that needs pyarrow, imported on a
codec's first decode (a trainer whose DataLoader workers decode never loads it).

Decoding hands pyarrow a *sparse file*: a file of the shard's length that holds only the fetched
column chunks. pyarrow reads exactly those bytes (it is given the parsed metadata, so it does
not look for the footer again) and never sees the rest. For small row groups the sparse file is
an anonymous memory map with the fetched bytes copied in at their offsets: pages never written
take no memory, and pyarrow reads it natively, without calling back into Python for each read
(which costs more than decoding a 20 KB row group). Large row groups are read through a Python
file object that hands out views of the fetched bytes, so they are not copied. Either way Arrow
decodes on the calling thread: its thread pool reading a Python file waits for the GIL.
"""

from __future__ import annotations

import io
import mmap
import os
import sys
import threading
from collections import OrderedDict
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from zephon.arrays import distinct
from zephon.errors import FormatError
from zephon.formats.blob import Blob
from zephon.formats.index import RowGroupIndex
from zephon.formats.parquet import MAGIC, leaf_fields
from zephon.formats.thrift import read_struct
from zephon.refs import ShardInfo

__all__ = ["Decoder", "decode_pool"]

_TABLES_KEEP = 8  # one tail read holds the footer of almost every real file
# Decoded row groups kept for the next reads of the same group, up to this many bytes (at
# least the last one): eight groups of 17 MB of JPEGs held 136 MB that bought nothing (an
# image epoch in the main process: 705-721 images/s either way, 1.24-1.32 -> 1.11-1.15 GB).
_TABLES_KEEP_BYTES = 32 << 20
# A small row group is read from a memory-mapped copy, a large one from views (module docs).
_LARGE_GROUP_BYTES = 1 << 20


class Decoder:
    """Rows of a dataset's Parquet shards, keeping the last few row groups decoded:
    consecutive chunks often draw rows from the same one, so each is decoded once. Lanes may
    decode at once (on threads, see ``ParquetCodec.releases_gil``), hence the lock."""

    def __init__(self, dataset: str, columns: tuple[str, ...] | None) -> None:
        self.dataset = dataset
        self.columns = columns
        self._tables: OrderedDict[tuple[str, str, int], tuple[pa.Table, int]] = OrderedDict()
        self._tables_bytes = 0
        self._lock = threading.Lock()

    def decode(
        self, shard: ShardInfo, index: RowGroupIndex, blob: Blob, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        source: pq.ParquetReader | None = None

        def table(group: int) -> pa.Table:
            nonlocal source
            key = (shard.uri, shard.version, group)
            with self._lock:
                cached = self._tables.get(key)
            if cached is not None:
                return cached[0]
            big = bool(index.group_nbytes[group] >= _LARGE_GROUP_BYTES)
            try:  # Arrow parses the footer here (discovery read its Thrift only)
                md = _cached_metadata(index.footer, shard.size_bytes)
                mapped = None if big else _mapped_group(blob, index.chunks[group])
                if mapped is not None:
                    reader = _reader(mapped, md)
                else:
                    if source is None:  # views of the fetched bytes, made once per call
                        footer_at = shard.size_bytes - len(index.footer)
                        full = Blob([*blob.parts, (footer_at, index.footer)])
                        source = _reader(_SparseFile(shard.size_bytes, full), md)
                    reader = source
                # No Arrow threads: with a Python file each of them waits for the GIL to read
                # (10 ms against 5 ms for a 7 MB group here), and small groups gain nothing.
                read = reader.read_row_group(
                    group,
                    column_indices=_leaves(index.footer, self.columns),
                    use_threads=False,
                )
            except (OSError, pa.ArrowException, KeyError) as exc:
                raise FormatError(
                    f"cannot decode row group {group} ({type(exc).__name__}: {exc})",
                    dataset=self.dataset,
                    uri=shard.uri,
                    sample=int(index.row_starts[group]),
                ) from None
            declared = int(index.row_starts[group + 1] - index.row_starts[group])
            if read.num_rows != declared:  # else rows past its end would be some other row
                raise FormatError(
                    f"row group {group} holds {read.num_rows} rows, its footer says {declared}",
                    dataset=self.dataset,
                    uri=shard.uri,
                    sample=int(index.row_starts[group]),
                )
            with self._lock:
                if key not in self._tables:  # another lane may have read it meanwhile
                    size = read.nbytes  # walks every buffer: once per table
                    self._tables[key] = (read, size)
                    self._tables_bytes += size
                while len(self._tables) > 1 and (
                    len(self._tables) > _TABLES_KEEP or self._tables_bytes > _TABLES_KEEP_BYTES
                ):
                    self._tables_bytes -= self._tables.popitem(last=False)[1][1]
            return read

        wanted = np.asarray(samples, dtype=np.int64)
        low, high = int(wanted.min()), int(wanted.max())
        try:
            return _rows(table, index.row_starts, wanted, low, high)
        except (UnicodeDecodeError, ValueError, pa.ArrowException) as exc:
            # Values that decode but do not convert (a damaged string's bytes, say).
            raise FormatError(
                f"cannot convert rows ({type(exc).__name__}: {exc})",
                dataset=self.dataset,
                uri=shard.uri,
                sample=low,
            ) from None


class _SparseFile(io.RawIOBase):
    """A read-only file of ``size`` bytes of which only ``blob``'s ranges exist."""

    def __init__(self, size: int, blob: Blob) -> None:
        self._size = size
        self._blob = blob
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        return self._size

    def read(self, size: int = -1) -> memoryview:
        # Arrow asks for a row group's column chunks in one read; a view of the fetched
        # bytes spares copying them through readinto.
        stop = self._size if size is None or size < 0 else min(self._pos + size, self._size)
        if stop <= self._pos:
            return memoryview(b"")
        data = self._blob.slice(self._pos, stop)
        self._pos = stop
        return data

    def readinto(self, buffer: Any) -> int:
        stop = min(self._pos + len(buffer), self._size)
        if stop <= self._pos:
            return 0
        data = self._blob.slice(self._pos, stop)
        buffer[: len(data)] = data
        self._pos = stop
        return len(data)


_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform == "linux" else 0)


def _mapped_group(blob: Blob, ranges: np.ndarray) -> pa.BufferReader | None:
    """A memory map holding just the column chunks ``ranges`` (``(start, stop)`` rows) of one
    row group at their offsets; ``None`` if they were not fetched or there is no room for the
    mapping (the caller then reads through views)."""
    spans = [(int(a), int(b)) for a, b in ranges]
    if not spans or not all(blob.covers(a, b) for a, b in spans):
        return None
    try:
        mapped = mmap.mmap(-1, max(b for _, b in spans), flags=mmap.MAP_PRIVATE | _NORESERVE)
    except (OSError, ValueError):
        return None
    for a, b in spans:
        mapped[a:b] = blob.slice(a, b)
    return pa.BufferReader(pa.py_buffer(mapped))


@lru_cache(maxsize=1)
def decode_pool() -> pa.MemoryPool:
    """The allocator row groups are decoded with: jemalloc where pyarrow has it, else the C
    library's; Arrow's default (mimalloc) only if ``ARROW_DEFAULT_MEMORY_POOL`` names one.
    mimalloc keeps the memory of freed row groups for reuse: a Parquet epoch in the main
    process (``benchmarks/peers.py``) peaked at 457 MB with it, 437 MB without."""
    if os.environ.get("ARROW_DEFAULT_MEMORY_POOL"):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except NotImplementedError:  # a build without jemalloc
        return pa.system_memory_pool()


def _reader(source: Any, md: pq.FileMetaData) -> pq.ParquetReader:
    reader = pq.ParquetReader(decode_pool())
    reader.open(source, metadata=md)
    return reader


def _metadata(footer: bytes, size: int) -> pq.FileMetaData:
    # The footer alone, behind a leading magic, is a file pyarrow can parse metadata from; the
    # offsets inside still refer to the real file, which is all the decoder needs.
    return pq.ParquetFile(pa.BufferReader(MAGIC + footer)).metadata


def _rows(table: Any, row_starts: np.ndarray, wanted: np.ndarray, low: int, high: int) -> list[Any]:
    """Rows ``wanted`` (shard row numbers, in that order) from the tables of their row
    groups; ``table(g)`` reads group ``g``."""
    first_group, last_group = (np.searchsorted(row_starts, (low, high), side="right") - 1).tolist()
    if first_group == last_group:  # the usual case: one row group
        first = int(row_starts[first_group])
        return _pick(table(first_group), wanted - first, low - first, high - first)
    groups = np.searchsorted(row_starts, wanted, side="right") - 1
    out: list[Any] = [None] * len(wanted)
    for g in distinct(groups):
        at = np.flatnonzero(groups == g)
        first = int(row_starts[g])
        positions = wanted[at] - first
        rows = _pick(table(g), positions, int(positions.min()), int(positions.max()))
        for i, row in zip(at.tolist(), rows, strict=True):
            out[i] = row
    return out


def _pick(table: pa.Table, positions: np.ndarray, low: int, high: int) -> list[dict[str, Any]]:
    """Rows at ``positions`` (in that order; ``low``/``high`` their extremes) as dicts."""
    n = len(positions)
    if table.num_columns == 0:
        return [{} for _ in range(n)]
    span = high - low + 1
    if span > 2 * n:  # sparse picks: copy just those rows
        return _to_dicts(pc.take(table, positions, memory_pool=decode_pool()))
    # Dense picks (runs of a shuffle block, or all of a range): convert the span once, with
    # no copy, and pick from it. n rows ascending within a span of n rows are the span.
    rows = _to_dicts(table.slice(low, span))
    if span == n and (n < 2 or bool((positions[1:] > positions[:-1]).all())):
        return rows
    return [rows[i] for i in (positions - low).tolist()]


def _to_dicts(table: pa.Table) -> list[dict[str, Any]]:
    # A struct array builds the row dicts in C: faster than Table.to_pylist.
    return table.to_struct_array().to_pylist()  # type: ignore[no-any-return]


@lru_cache(maxsize=256)
def _leaves(footer: bytes, columns: tuple[str, ...] | None) -> list[int] | None:
    """The leaf columns holding ``columns`` (top-level names, in that order), as pyarrow's
    reader takes them; ``None``: all."""
    if columns is None:
        return None
    fields = leaf_fields(read_struct(footer[:-8]))
    return [c for name in columns for c, top in enumerate(fields) if top == name]


@lru_cache(maxsize=256)
def _cached_metadata(footer: bytes, size: int) -> pq.FileMetaData:
    return _metadata(footer, size)

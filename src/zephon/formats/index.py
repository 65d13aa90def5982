"""Shard indexes: where each sample's bytes lie inside a shard.

Three shapes cover every format:

- :class:`RecordIndex`: sample ``i`` is the contiguous byte span ``[offsets[i], offsets[i+1])``
  (JSONL lines, MDS and LitData samples, WebDataset member groups). Neighbouring samples are
  neighbouring bytes, so a run of samples is one range read.
- :class:`RowGroupIndex`: samples are rows; the read unit is a row group, and only the column
  chunks of the selected columns are read (Parquet).
- :class:`StreamIndex`: the shard is compressed as a whole (``.jsonl.gz``, ``.zst``); the read
  unit is the whole shard, and ``offsets`` are positions in the decompressed stream.
- :class:`FragmentIndex`: rows of a fragment that the format's own reader fetches (Lance);
  Zephon fetches no bytes for it, and the codec reads the rows it is asked for.
- :class:`WholeIndex`: a record shard compressed as a whole (MDS ``zip_data``, LitData
  ``.zstd.bin``): read whole, decompressed, and its own header says where samples lie. Known
  from the dataset's index file alone (sample count, sizes, codec), so discovery reads nothing.

Indexes serialise to compact bytes (``to_bytes``/``from_bytes``) for the local index cache and
for persistent indexes written by ``zephon index``.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from zephon.formats.jsondata import parse_json

__all__ = [
    "FragmentIndex",
    "RecordIndex",
    "RowGroupIndex",
    "ShardIndex",
    "StreamIndex",
    "WholeIndex",
    "coalesced",
    "index_from_bytes",
]

ShardIndex = "RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex"


def coalesced(spans: Iterable[tuple[int, int]], gap: int) -> list[tuple[int, int]]:
    """Byte spans sorted and merged where at most ``gap`` bytes apart."""
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(set(spans)):
        if merged and start - merged[-1][1] <= gap:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


_MAGIC = b"ZIX1"


def _pack(kind: str, meta: dict[str, object], arrays: dict[str, np.ndarray]) -> bytes:
    header = json.dumps(
        {
            "kind": kind,
            "meta": meta,
            "arrays": {k: [str(a.dtype), list(a.shape)] for k, a in arrays.items()},
        }
    ).encode()
    body = b"".join(np.ascontiguousarray(a).tobytes() for a in arrays.values())
    return _MAGIC + struct.pack("<I", len(header)) + header + zlib.compress(body, 1)


def _unpack(data: bytes) -> tuple[str, dict[str, object], dict[str, np.ndarray]]:
    if data[:4] != _MAGIC:
        raise ValueError("not a Zephon shard index")
    (hlen,) = struct.unpack_from("<I", data, 4)
    header = parse_json(data[8 : 8 + hlen])
    body = zlib.decompress(data[8 + hlen :])
    arrays, pos = {}, 0
    for name, (dtype, shape) in header["arrays"].items():
        dt = np.dtype(dtype)
        count = int(np.prod(shape)) if shape else 1
        arrays[name] = np.frombuffer(body, dt, count, pos).reshape(shape)
        pos += count * dt.itemsize
    return header["kind"], header["meta"], arrays


@dataclass(frozen=True, eq=False)
class RecordIndex:
    """Sample ``i`` occupies bytes ``[offsets[i], offsets[i+1])`` (int64 offsets, n+1 long)."""

    offsets: np.ndarray

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def sample_nbytes(self, samples: np.ndarray) -> np.ndarray:
        """Bytes of each of ``samples`` (estimates where the index has no exact sizes);
        memory in the number asked for, never in the number of samples the shard declares."""
        out: np.ndarray = self.offsets[samples + 1] - self.offsets[samples]
        return out

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Byte ranges holding samples ``[start, stop)``: one contiguous range."""
        return [(int(self.offsets[start]), int(self.offsets[stop]))]

    def to_bytes(self) -> bytes:
        return _pack("record", {}, {"offsets": self.offsets.astype("<i8")})


@dataclass(frozen=True, eq=False)
class RowGroupIndex:
    """Rows ``[row_starts[g], row_starts[g+1])`` form row group ``g``, whose selected column
    chunks are the byte ranges ``chunks[g]`` (shape ``(groups, columns, 2)``). ``footer`` is the
    raw Parquet footer (metadata) the decoder needs."""

    row_starts: np.ndarray
    chunks: np.ndarray
    footer: bytes
    group_nbytes: np.ndarray

    @property
    def num_samples(self) -> int:
        return int(self.row_starts[-1])

    def sample_nbytes(self, samples: np.ndarray) -> np.ndarray:
        rows = np.diff(self.row_starts)
        per_row = np.divide(self.group_nbytes, np.maximum(rows, 1))
        out: np.ndarray = per_row[np.searchsorted(self.row_starts, samples, side="right") - 1]
        return out

    def groups(self, start: int, stop: int) -> range:
        first = int(np.searchsorted(self.row_starts, start, side="right")) - 1
        last = int(np.searchsorted(self.row_starts, stop, side="left"))
        return range(first, last)

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Column-chunk ranges of the row groups holding rows ``[start, stop)``."""
        return [(int(a), int(b)) for g in self.groups(start, stop) for a, b in self.chunks[g]]

    def to_bytes(self) -> bytes:
        return _pack(
            "rowgroup",
            {},
            {
                "footer": np.frombuffer(self.footer, np.uint8),
                "row_starts": self.row_starts.astype("<i8"),
                "chunks": self.chunks.astype("<i8"),
                "group_nbytes": self.group_nbytes.astype("<i8"),
            },
        )


@dataclass(frozen=True, eq=False)
class StreamIndex:
    """A whole-shard-compressed shard of ``size_bytes``; sample ``i`` is decompressed bytes
    ``[offsets[i], offsets[i+1])``."""

    offsets: np.ndarray
    size_bytes: int

    @property
    def num_samples(self) -> int:
        return len(self.offsets) - 1

    def sample_nbytes(self, samples: np.ndarray) -> np.ndarray:
        out: np.ndarray = self.offsets[samples + 1] - self.offsets[samples]
        return out

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        return [(0, self.size_bytes)]

    def to_bytes(self) -> bytes:
        return _pack(
            "stream", {"size_bytes": self.size_bytes}, {"offsets": self.offsets.astype("<i8")}
        )


@dataclass(frozen=True, eq=False)
class WholeIndex:
    """A record shard of ``count`` samples compressed as a whole with ``codec`` into
    ``size_bytes`` (``raw_bytes`` decompressed). Sample sizes are estimated as equal until the
    shard is read; the codec finds the true offsets in the decompressed header."""

    count: int
    size_bytes: int
    raw_bytes: int
    codec: str

    @property
    def num_samples(self) -> int:
        return self.count

    def sample_nbytes(self, samples: np.ndarray) -> np.ndarray:
        return np.full(len(samples), self.raw_bytes / max(1, self.count))

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        return [(0, self.size_bytes)]

    def to_bytes(self) -> bytes:
        meta = {
            "count": self.count,
            "size_bytes": self.size_bytes,
            "raw_bytes": self.raw_bytes,
            "codec": self.codec,
        }
        return _pack("whole", meta, {})


@dataclass(frozen=True, eq=False)
class FragmentIndex:
    """``count`` rows of a fragment of about ``row_bytes`` each, read by the format's reader
    (one read per chunk and fragment, of no bytes through Zephon's storage)."""

    count: int
    row_bytes: float

    @property
    def num_samples(self) -> int:
        return self.count

    def sample_nbytes(self, samples: np.ndarray) -> np.ndarray:
        return np.full(len(samples), float(self.row_bytes))

    def span(self, start: int, stop: int) -> list[tuple[int, int]]:
        return []

    def to_bytes(self) -> bytes:
        return _pack("fragment", {"count": self.count, "row_bytes": self.row_bytes}, {})


def index_from_bytes(
    data: bytes,
) -> RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex:
    """Inverse of ``to_bytes`` of any index. Raises ``ValueError`` on foreign or corrupt bytes."""
    try:
        kind, meta, arrays = _unpack(data)
    except (struct.error, zlib.error, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"corrupt shard index ({type(exc).__name__})") from None
    if kind == "record":
        return RecordIndex(arrays["offsets"])
    if kind == "rowgroup":
        return RowGroupIndex(
            arrays["row_starts"],
            arrays["chunks"],
            arrays["footer"].tobytes(),
            arrays["group_nbytes"],
        )
    if kind == "stream":
        return StreamIndex(arrays["offsets"], int(str(meta["size_bytes"])))
    if kind == "fragment":
        return FragmentIndex(int(str(meta["count"])), float(str(meta["row_bytes"])))
    if kind == "whole":
        return WholeIndex(
            int(str(meta["count"])),
            int(str(meta["size_bytes"])),
            int(str(meta["raw_bytes"])),
            str(meta["codec"]),
        )
    raise ValueError(f"unknown shard index kind {kind!r}")

"""Shared helpers of the two "header + offsets + samples" shard layouts (MDS, LitData).

Both begin with ``uint32 n`` and ``uint32 offsets[n + 1]`` (absolute offsets in the shard), so
the header of a shard with ``n`` samples is exactly ``4 * (n + 2)`` bytes: one range read.
A shard compressed as a whole (:class:`WholeIndex`) is the same layout once decompressed.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from zephon.errors import FormatError
from zephon.formats.blob import Blob
from zephon.formats.compression import Inflated, decompress_whole, inflate_limit
from zephon.formats.index import RecordIndex, WholeIndex
from zephon.refs import ShardInfo

__all__ = [
    "decode_columns",
    "dict_rows",
    "header_bytes",
    "inflate_records",
    "parse_offsets_header",
    "raw_image",
]

_PIL_CHANNELS = {"L": 1, "LA": 2, "RGB": 3, "RGBA": 4}  # 8 bits per channel


def raw_image(data: memoryview | bytes) -> np.ndarray:
    """An image stored as raw pixels by MDS's ``pil`` encoding and LitData's ``pil``
    serializer (``width, height, len(mode)`` as uint32, the PIL mode, then the pixels), as a
    uint8 ``HxWxC`` array (``HxW`` for mode ``L``), without Pillow."""
    if len(data) < 12:
        raise ValueError("raw image shorter than its header")
    width, height, mode_size = (int(x) for x in np.frombuffer(data, np.uint32, 3))
    mode = bytes(data[12 : 12 + mode_size]).decode("utf-8", "replace")
    channels = _PIL_CHANNELS.get(mode)
    if channels is None:
        raise ValueError(f"raw image of PIL mode {mode!r}: only {sorted(_PIL_CHANNELS)} are read")
    pixels = np.frombuffer(data, np.uint8, offset=12 + mode_size)
    if pixels.size != width * height * channels:
        raise ValueError(f"raw {mode} image of {width}x{height} holds {pixels.size} bytes")
    shape = (height, width) if channels == 1 else (height, width, channels)
    return pixels.reshape(shape).copy()


def header_bytes(num_samples: int) -> int:
    return 4 * (num_samples + 2)


def parse_offsets_header(data: bytes, num_samples: int, shard_size: int) -> RecordIndex:
    """The :class:`RecordIndex` of a shard from its first ``header_bytes(n)`` bytes.

    Raises ``ValueError`` if the header disagrees with the index file or the shard's size.
    """
    if len(data) < header_bytes(num_samples):
        raise ValueError(f"header is {len(data)} bytes, expected {header_bytes(num_samples)}")
    (n,) = np.frombuffer(data, np.uint32, 1)
    if int(n) != num_samples:
        raise ValueError(f"shard header says {int(n)} samples, the index says {num_samples}")
    offsets = np.frombuffer(data, np.uint32, num_samples + 1, 4).astype(np.int64)
    if num_samples and (np.any(np.diff(offsets) < 0) or offsets[-1] > shard_size):
        raise ValueError("sample offsets in the shard header are out of order or past its end")
    return RecordIndex(offsets)


def inflate_records(
    shard: ShardInfo,
    index: WholeIndex,
    blob: Blob,
    inflated: Inflated,
    codecs: dict[str, Callable[[bytes, int], bytes]],
    dataset: str,
    raw_declared: bool,
) -> tuple[RecordIndex, Blob]:
    """A compressed record shard as an uncompressed one: its offsets and its bytes,
    decompressed once per shard (``inflated`` keeps the last few), to at most the size the
    index declares (``raw_declared``: MDS's ``raw_data``; LitData's ``chunk_bytes`` is the
    compressed size) or :func:`~zephon.formats.compression.inflate_limit`."""

    def fail(exc: ValueError) -> FormatError:
        return FormatError(f"compressed shard: {exc}", dataset=dataset, uri=shard.uri)

    def inflate() -> bytes:
        try:
            data = bytes(blob.slice(0, shard.size_bytes))
            limit = inflate_limit(len(data), index.raw_bytes if raw_declared else None)
            return decompress_whole(index.codec, data, codecs, limit)
        except ValueError as exc:
            raise fail(exc) from None

    def parse(raw: bytes) -> tuple[RecordIndex, Blob]:
        try:
            return parse_offsets_header(raw, index.count, len(raw)), Blob([(0, raw)])
        except ValueError as exc:
            raise fail(exc) from None

    out: tuple[RecordIndex, Blob] = inflated.get((shard.uri, shard.version), inflate, parse)
    return out


Vector = tuple[np.dtype[Any], bool]  # a fixed-size scalar field: its dtype, as Python values?


def decode_columns(
    blob: Blob,
    offsets: np.ndarray,
    samples: Sequence[int],
    sizes: Sequence[int | None],
    decoders: Sequence[Callable[[memoryview], Any]],
    vectors: Sequence[Vector | None],
) -> list[list[Any]] | None:
    """The fields of many samples at once, column by column: ``columns[k][j]`` is field ``k``
    of ``samples[j]``. Each sample is the ``uint32`` sizes of its variable fields (those whose
    ``sizes`` entry is ``None``), then its fields in order. The sizes, the bounds checks and
    fixed-size scalar fields (``vectors``) are done in numpy for the whole batch, the rest by
    one decoder call per field, with no per-sample bookkeeping in Python.

    ``None`` when the batch cannot be done so (its samples are in more than one fetched
    range, a field runs past its sample, a decoder refuses a value): the caller then decodes
    sample by sample, which names the bad sample.
    """
    if len(samples) < 8:
        return None
    picked = np.asarray(samples, dtype=np.int64)
    starts, stops = offsets[picked], offsets[picked + 1]
    lo, hi = int(starts.min()), int(stops.max())
    if not blob.covers(lo, hi):
        return None
    view = blob.slice(lo, hi)
    raw = np.frombuffer(view, np.uint8)
    starts, stops = starts - lo, stops - lo
    variable = [k for k, size in enumerate(sizes) if not size]
    header = 4 * len(variable)
    if len(variable) and (stops - starts < header).any():
        return None
    widths = np.empty((len(picked), len(sizes)), dtype=np.int64)
    for k, size in enumerate(sizes):
        if size:
            widths[:, k] = size
    if variable:
        where = starts[:, None] + np.arange(header)
        declared = np.ascontiguousarray(raw[where]).view("<u4")
        widths[:, variable] = declared
    bounds = np.empty((len(picked), len(sizes) + 1), dtype=np.int64)
    bounds[:, 0] = starts + header
    np.cumsum(widths, axis=1, out=bounds[:, 1:])
    bounds[:, 1:] += bounds[:, :1]
    if (bounds[:, -1] > stops).any():
        return None
    try:
        return [
            _column(view, raw, bounds[:, k], bounds[:, k + 1], decoders[k], vectors[k])
            for k in range(len(sizes))
        ]
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, struct.error):
        return None


def _column(
    view: memoryview,
    raw: np.ndarray,
    begin: np.ndarray,
    end: np.ndarray,
    decode: Callable[[memoryview], Any],
    vector: Vector | None,
) -> list[Any]:
    if vector is not None:
        dtype, as_python = vector
        if (end - begin == dtype.itemsize).all():
            values = np.ascontiguousarray(raw[begin[:, None] + np.arange(dtype.itemsize)])
            column = values.view(dtype).ravel()
            return column.tolist() if as_python else list(column)
    return [decode(view[a:b]) for a, b in zip(begin.tolist(), end.tolist(), strict=True)]


def dict_rows(names: Sequence[str], columns: Sequence[Sequence[Any]]) -> list[dict[str, Any]]:
    """The rows of ``columns`` as dicts, field ``k`` under ``names[k]``: a dict display per
    row, from a constructor made for these names (cheaper than ``dict(zip(names, row))``,
    which builds an iterator and a tuple per row)."""
    if not names or len(names) > 255 or len({len(c) for c in columns}) != 1:
        return [dict(zip(names, row, strict=True)) for row in zip(*columns, strict=True)]
    return list(map(_row_maker(tuple(names)), *columns))


@functools.lru_cache(maxsize=256)
def _row_maker(names: tuple[str, ...]) -> Callable[..., dict[str, Any]]:
    """``make(v0, ..., vn) -> {names[0]: v0, ...}``. Its source holds generated identifiers
    only: the names (from a dataset's files) are values of its scope, never code."""
    values = ", ".join(f"v{i}" for i in range(len(names)))
    items = ", ".join(f"k{i}: v{i}" for i in range(len(names)))
    scope: dict[str, Any] = {f"k{i}": name for i, name in enumerate(names)}
    exec(f"def make({values}):\n    return {{{items}}}", scope)
    maker: Callable[..., dict[str, Any]] = scope["make"]
    return maker

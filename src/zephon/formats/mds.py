"""MosaicML Streaming (MDS): ``index.json`` lists shards with sample counts and column
encodings; each ``shard.*.mds`` starts with its sample offsets.

A sample is ``[uint32 size per variable-size column] + column values``. Supported encodings:
``bytes``, ``str``, ``int``, the numpy scalars (``uint8`` ... ``float64``), ``str_int``,
``str_float``, ``str_decimal``, ``json``, ``ndarray[:dtype[:shape]]``; ``jpeg``/``png`` are
returned as their encoded bytes. ``pkl`` executes code when loaded, so it is refused unless the
dataset is opened with ``allow_pickle=True``.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from zephon.errors import FormatError
from zephon.formats.blob import Blob
from zephon.formats.codec import BaseCodec
from zephon.formats.compression import MDS_CODECS, Inflated
from zephon.formats.index import RecordIndex, WholeIndex
from zephon.formats.jsondata import count, parse_json
from zephon.formats.records import (
    Vector,
    decode_columns,
    dict_rows,
    inflate_records,
    raw_image,
)
from zephon.refs import ShardInfo

__all__ = ["MdsCodec", "MdsShardSpec", "parse_mds_index"]

_SCALARS = {
    name: np.dtype(name)
    for name in ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
                 "float16", "float32", "float64")
}  # fmt: skip
_VALUE_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32",
                 33: "int32", 34: "float32", 64: "uint64", 65: "int64", 66: "float64"}  # fmt: skip
_SHAPE_DTYPES = {0: "uint8", 1: "uint16", 2: "uint32", 3: "uint64"}


class MdsShardSpec:
    """One shard entry of an MDS ``index.json``."""

    def __init__(self, entry: dict[str, Any]) -> None:
        if entry.get("format") != "mds" or entry.get("version") != 2:
            raise ValueError(
                f"unsupported MDS shard entry (format {entry.get('format')!r}, "
                f"version {entry.get('version')!r}; expected 'mds', 2)"
            )
        self.num_samples: int = count(entry["samples"], "samples")
        self.column_names: list[str] = list(entry["column_names"])
        self.column_encodings: list[str] = list(entry["column_encodings"])
        self.column_sizes: list[int | None] = [
            None if size is None else count(size, "column_sizes") or None
            for size in entry["column_sizes"]
        ]
        self.compression: str | None = entry.get("compression") or None
        self.raw_bytes = count(entry["raw_data"].get("bytes") or 0, "raw_data.bytes")
        if self.compression is not None and not isinstance(self.compression, str):
            raise TypeError("compression must be a string")
        if self.compression is not None:  # the shard as written is its zip_data
            name = self.compression.split(":", 1)[0]
            if name not in MDS_CODECS:
                raise ValueError(
                    f"unknown MDS compression {self.compression!r} (known: {sorted(MDS_CODECS)})"
                )
            self.basename: str = entry["zip_data"]["basename"]
        else:
            self.basename = entry["raw_data"]["basename"]
        texts = [self.basename, *self.column_names, *self.column_encodings]
        if (
            not all(isinstance(t, str) for t in texts)
            or len({len(self.column_names), len(self.column_encodings), len(self.column_sizes)})
            != 1
        ):
            raise TypeError("names and encodings must be strings, one of each per column")


def parse_mds_index(data: bytes) -> list[MdsShardSpec]:
    """Shard specs of an MDS ``index.json``. Raises ``ValueError`` if it is not one."""
    try:
        obj = parse_json(data)
    except ValueError as exc:
        raise ValueError(f"not an MDS index.json ({exc})") from None
    try:
        shards = obj["shards"]
        if obj.get("version") != 2 or not isinstance(shards, list):
            raise ValueError(f"MDS index version {obj.get('version')!r}, expected 2")
        return [MdsShardSpec(entry) for entry in shards]
    except (KeyError, TypeError, AttributeError, IndexError) as exc:
        # a field of the wrong JSON type, found where it is used
        raise ValueError(f"not an MDS index.json ({type(exc).__name__}: {exc})") from None


def _ndarray(spec: str) -> Callable[[memoryview], Any]:
    parts = spec.split(":")[1:]
    try:  # checked here, when the codec is built, so a bad index fails at discovery
        # numpy parses some dtype strings as Python (SyntaxError); only plain numbers allowed
        fixed_dtype = np.dtype(parts[0]) if parts and parts[0] else None
        fixed_shape = tuple(int(d) for d in parts[1].split(",")) if len(parts) > 1 else None
    except Exception as exc:
        raise ValueError(f"unsupported MDS encoding {spec!r} ({type(exc).__name__})") from None
    if fixed_dtype is not None and (fixed_dtype.kind not in "biufc" or fixed_dtype.fields):
        raise ValueError(f"unsupported MDS encoding {spec!r} (not a numeric dtype)")

    def decode(data: memoryview) -> Any:
        pos = 0
        dtype = fixed_dtype
        if dtype is None:
            dtype = np.dtype(_VALUE_DTYPES[data[0]])
            pos = 1
        shape = fixed_shape
        if shape is None:
            byte = data[pos]
            ndim, shape_dtype = byte >> 2, np.dtype(_SHAPE_DTYPES[byte & 3])
            pos += 1
            shape = tuple(int(d) for d in np.frombuffer(data, shape_dtype, ndim, pos))
            pos += ndim * shape_dtype.itemsize
        return np.frombuffer(data[pos:], dtype).reshape(shape).copy()

    return decode


def _vector(encoding: str) -> Vector | None:
    """How :func:`~zephon.formats.records.decode_columns` reads a fixed-size scalar column
    in one go, giving the values :func:`_decoder`'s function gives one by one."""
    if encoding in _SCALARS:
        return _SCALARS[encoding], False  # numpy scalars
    if encoding == "int":
        return np.dtype(np.int64), True  # Python ints
    return None


def _decoder(encoding: str, allow_pickle: bool) -> Callable[[memoryview], Any]:
    if encoding in _SCALARS:
        dt = _SCALARS[encoding]
        return lambda data: np.frombuffer(data, dt, 1)[0]
    simple: dict[str, Callable[[memoryview], Any]] = {
        "bytes": bytes,
        "jpeg": bytes,
        "png": bytes,
        "str": lambda d: str(d, "utf-8"),
        "int": lambda d: int(np.frombuffer(d, np.int64, 1)[0]),
        "str_int": lambda d: int(str(d, "utf-8")),
        "str_float": lambda d: float(str(d, "utf-8")),
        "str_decimal": lambda d: Decimal(str(d, "utf-8")),
        "json": lambda d: parse_json(bytes(d)),
        "pil": raw_image,  # raw pixels: decoded here, no Pillow
    }
    if encoding in simple:
        return simple[encoding]
    if encoding == "ndarray" or encoding.startswith("ndarray:"):
        return _ndarray(encoding)
    if encoding == "pkl":
        if not allow_pickle:
            raise ValueError(
                "column uses the 'pkl' encoding, which runs code when loaded; "
                "open the dataset with allow_pickle=True only if you trust its source"
            )
        return lambda d: pickle.loads(bytes(d))
    raise ValueError(f"unsupported MDS encoding {encoding!r}")


class MdsCodec(BaseCodec):
    """Decodes MDS samples into ``{column: value}``.

    Args:
        dataset: dataset name, for errors.
        columns: per shard URI, ``(names, encodings, sizes)`` from its index entry.
        allow_pickle: allow the ``pkl`` encoding.

    Raises:
        FormatError: at construction, for refused or unknown encodings.
    """

    format = "mds"

    def __init__(
        self,
        dataset: str,
        columns: dict[str, tuple[list[str], list[str], list[int | None]]],
        allow_pickle: bool,
    ) -> None:
        self.dataset = dataset
        self.columns = columns
        self.allow_pickle = allow_pickle
        self._decoders: dict[tuple[str, ...], list[Callable[[memoryview], Any]]] = {}
        self._inflated = Inflated()
        for uri, (_, encodings, _) in columns.items():
            try:
                self._decoders_for(encodings)
            except ValueError as exc:
                raise FormatError(str(exc), dataset=dataset, uri=uri) from None

    def _decoders_for(self, encodings: list[str]) -> list[Callable[[memoryview], Any]]:
        key = tuple(encodings)
        if key not in self._decoders:
            self._decoders[key] = [_decoder(e, self.allow_pickle) for e in encodings]
        return self._decoders[key]

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "columns": self.columns, "allow_pickle": self.allow_pickle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._decoders = {}
        self._inflated = Inflated()

    def use_disk_cache(self, cache: Any) -> None:
        """Keep decompressed shards in ``cache`` (a DiskCache) as well as in memory."""
        self._inflated.disk = cache

    def decode(
        self,
        shard: ShardInfo,
        index: RecordIndex | WholeIndex,
        blob: Blob,
        samples: Sequence[int],
    ) -> list[dict[str, Any]]:
        if isinstance(index, WholeIndex):
            index, blob = inflate_records(
                shard, index, blob, self._inflated, MDS_CODECS, self.dataset, raw_declared=True
            )
        names, encodings, sizes = self.columns[shard.uri]
        decoders = self._decoders_for(encodings)
        vectors = [_vector(e) for e in encodings]
        columns = decode_columns(blob, index.offsets, samples, sizes, decoders, vectors)
        if columns is not None:
            return dict_rows(names, columns)
        out = []
        for i in samples:
            data = blob.slice(int(index.offsets[i]), int(index.offsets[i + 1]))
            try:
                out.append(_decode_sample(data, names, decoders, sizes))
            except (ValueError, IndexError, KeyError, UnicodeDecodeError) as exc:
                raise FormatError(
                    f"corrupt MDS sample ({type(exc).__name__}: {exc})",
                    dataset=self.dataset,
                    uri=shard.uri,
                    sample=i,
                ) from None
        return out


def _decode_sample(
    data: memoryview,
    names: Sequence[str],
    decoders: Sequence[Callable[[memoryview], Any]],
    sizes: Sequence[int | None],
) -> dict[str, Any]:
    variable = sum(1 for s in sizes if not s)
    var_sizes = iter(np.frombuffer(data, np.uint32, variable).tolist()) if variable else iter(())
    pos = 4 * variable
    sample = {}
    for name, decode, size in zip(names, decoders, sizes, strict=True):
        n = size or next(var_sizes)
        if pos + n > len(data):
            raise ValueError(f"column {name!r} runs past the end of the sample")
        sample[name] = decode(data[pos : pos + n])
        pos += n
    return sample

"""LitData (``litdata.optimize`` output): ``index.json`` lists chunks with sample counts and the
pytree of one sample; each ``chunk-*.bin`` starts with its sample offsets.

A sample is ``uint32 size per leaf`` + leaf bytes, rebuilt into the pytree (dicts, lists,
tuples) described by ``config.data_spec``. Supported leaves: ``str``, ``bool``, ``int``,
``float``, ``bytes``, ``numpy``/``no_header_numpy``, ``tensor``/``no_header_tensor`` (returned
as numpy arrays: Zephon does not need torch to read), ``jpeg``/``image``/``file`` as encoded
bytes. ``pickle`` is refused unless ``allow_pickle=True``.
"""

from __future__ import annotations

import itertools
import pickle
import struct
from collections.abc import Callable, Sequence
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

__all__ = ["LITDATA_CODECS", "LitDataCodec", "parse_litdata_index"]

_FRAMED_MAGIC = b"LDFZ01\0\0"
_FRAMED_PREFIX = struct.Struct("<8sHHIII")  # magic, version, flags, items, rows/frame, frames
_FRAMED_ENTRY = struct.Struct("<IIQII")  # first item, items, offset, length, raw length
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _classic(items: list[bytes]) -> bytes:
    """A classic chunk (``n``, absolute offsets, items) of ``items``."""
    n = len(items)
    sizes = np.array([len(x) for x in items], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes))) + 4 * (n + 2)
    if offsets[-1] >= 1 << 32:
        raise ValueError("decompressed chunk over 4 GiB")
    return struct.pack("<I", n) + offsets.astype("<u4").tobytes() + b"".join(items)


def _zstd_frame(data: bytes, limit: int, raw_length: int | None = None) -> bytes:
    out = MDS_CODECS["zstd"](data, limit if raw_length is None else min(limit, raw_length))
    if raw_length is not None and len(out) != raw_length:
        raise ValueError(f"a zstd frame gave {len(out)} bytes, its table says {raw_length}")
    return out


def _inflate_chunk(data: bytes, limit: int) -> bytes:
    """A zstd-compressed LitData chunk as a classic one, whichever ``compression_level``
    wrote it: ``chunk`` (the file is one zstd stream), ``batch`` (``LDFZ01`` framed: a table of
    zstd frames of consecutive items) or ``sample`` (a classic header over one zstd frame per
    item); its items at most ``limit`` bytes in all."""
    if data[:4] == _ZSTD_MAGIC:
        return _zstd_frame(data, limit)
    if data[:8] == _FRAMED_MAGIC:
        _, version, _, n, _, frames = _FRAMED_PREFIX.unpack_from(data, 0)
        if version != 1:
            raise ValueError(f"framed LitData chunk version {version}, expected 1")
        rel = np.frombuffer(data, np.uint32, n + 1, _FRAMED_PREFIX.size).astype(np.int64)
        table = _FRAMED_PREFIX.size + 4 * (n + 1)
        parts = []
        for f in range(frames):
            _, _, at, length, raw = _FRAMED_ENTRY.unpack_from(data, table + f * _FRAMED_ENTRY.size)
            if at + length > len(data):
                raise ValueError("a zstd frame runs past the end of the chunk")
            parts.append(_zstd_frame(data[at : at + length], limit, raw))
            limit -= raw
        body = b"".join(parts)
        if len(body) != rel[-1] or np.any(np.diff(rel) < 0):
            raise ValueError("the frames do not match the chunk's item offsets")
        return _classic(
            [body[a:b] for a, b in zip(rel[:-1].tolist(), rel[1:].tolist(), strict=True)]
        )
    (n,) = struct.unpack_from("<I", data, 0)
    offsets = np.frombuffer(data, np.uint32, n + 1, 4).astype(np.int64).tolist()
    if offsets[-1] > len(data) or any(b < a for a, b in itertools.pairwise(offsets)):
        raise ValueError("item offsets out of order or past the end of the chunk")
    items = []
    for a, b in itertools.pairwise(offsets):
        items.append(_zstd_frame(data[a:b], limit))
        limit -= len(items[-1])
    return _classic(items)


def _inflate(data: bytes, limit: int) -> bytes:
    try:
        return _inflate_chunk(data, limit)
    except struct.error as exc:
        raise ValueError(f"truncated chunk ({exc})") from None


# LitData compresses chunks with zstd (``optimize(compression="zstd")``), at any level.
LITDATA_CODECS: dict[str, Callable[[bytes, int], bytes]] = {"zstd": _inflate}

# LitData's dtype tables (litdata/constants.py): numbering is part of the on-disk format.
_NUMPY_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
                 np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128,
                 np.bool_]  # fmt: skip
_TORCH_DTYPES = {0: "float32", 1: "float32", 2: "float64", 3: "float64", 4: "complex64",
                 5: "complex64", 6: "complex128", 7: "complex128", 8: "float16", 9: "float16",
                 11: "uint8", 12: "int8", 13: "int16", 14: "int16", 15: "int32", 16: "int32",
                 17: "int64", 18: "int64", 19: "bool", 20: "uint16"}  # fmt: skip


def parse_litdata_index(data: bytes) -> tuple[list[tuple[str, int, int]], dict[str, Any]]:
    """``([(chunk filename, samples, bytes uncompressed)], config)`` of a LitData
    ``index.json``.

    Raises ``ValueError`` if it is not one or uses features Zephon cannot read.
    """
    try:
        obj = parse_json(data)
        config = obj["config"]
        chunks = [
            (
                str(c["filename"]),
                count(c["chunk_size"], "chunk_size"),
                count(c.get("chunk_bytes") or 0, "chunk_bytes"),
            )
            for c in obj["chunks"]
        ]
        data_format = list(config["data_format"])
        if not isinstance(config, dict) or not all(isinstance(f, str) for f in data_format):
            raise TypeError("config and data_format must be an object and strings")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ValueError(f"not a LitData index.json ({type(exc).__name__}: {exc})") from None
    compression = config.get("compression")
    if compression and str(compression).split(":", 1)[0] not in LITDATA_CODECS:
        raise ValueError(
            f"LitData compression {compression!r} is not supported "
            f"(known: {sorted(LITDATA_CODECS)})"
        )

    if config.get("encryption"):
        raise ValueError("encrypted LitData chunks are not supported")
    if config.get("item_loader", "PyTreeLoader") != "PyTreeLoader":
        raise ValueError(f"LitData item loader {config['item_loader']!r} is not supported")
    if not data_format:
        raise ValueError("LitData index has no data_format")
    return chunks, config


_LEAF_VECTORS: dict[str, Vector] = {  # what decode_columns reads in one go: Python values
    "int": (np.dtype("<i8"), True),
    "float": (np.dtype("<f8"), True),
}


def _leaf_decoder(name: str, allow_pickle: bool) -> Callable[[memoryview], Any]:
    kind, _, arg = name.partition(":")
    if kind in ("str", "text"):
        return lambda d: str(d, "utf-8")
    if kind == "bool":
        return lambda d: d[0] != 0
    if kind == "int":
        return lambda d: struct.unpack("<q", d)[0]
    if kind == "float":
        return lambda d: struct.unpack("<d", d)[0]
    if kind in ("bytes", "jpeg", "image", "file"):
        return bytes
    if kind == "pil":  # raw pixels: decoded here, no Pillow
        return raw_image
    if kind == "no_header_numpy":
        dt = np.dtype(_NUMPY_DTYPES[int(arg)])
        return lambda d: np.frombuffer(d, dt).copy()
    if kind == "no_header_tensor":
        dt = np.dtype(_TORCH_DTYPES[int(arg)])
        return lambda d: np.frombuffer(d, dt).copy()
    if kind == "numpy":
        return _numpy_with_header
    if kind == "tensor":
        return _tensor_with_header
    if kind == "pickle":
        if not allow_pickle:
            raise ValueError(
                "a field uses LitData's 'pickle' serializer, which runs code when loaded; "
                "open the dataset with allow_pickle=True only if you trust its source"
            )
        return lambda d: pickle.loads(bytes(d))
    raise ValueError(f"unsupported LitData serializer {name!r}")


def _numpy_with_header(d: memoryview) -> np.ndarray:
    dtype_index, ndim = struct.unpack_from("<II", d)
    shape = struct.unpack_from(f"<{ndim}I", d, 8)
    data = d[8 + 4 * ndim :]
    return np.frombuffer(data, _NUMPY_DTYPES[dtype_index]).reshape(shape).copy()


def _tensor_with_header(d: memoryview) -> np.ndarray:
    dtype_index, ndim = struct.unpack_from(">II", d)
    shape = struct.unpack_from(f">{ndim}I", d, 8)
    data = d[8 + 4 * ndim :]
    return np.frombuffer(data, _TORCH_DTYPES[dtype_index]).reshape(shape).copy()


_NODES = ("builtins.dict", "collections.OrderedDict", "builtins.tuple", "builtins.list")
MAX_SPEC_DEPTH = 64  # pytrees of samples nest a few levels; the bound keeps the walk shallow


def _check_spec(spec: Any, leaves: int) -> None:
    """Refuses a ``data_spec`` pytree that :func:`_unflatten` could not walk with ``leaves``
    leaves: a node of an unknown type or shape, dict keys that do not match its children,
    nesting deeper than :data:`MAX_SPEC_DEPTH`. Keeps each dict node's parsed keys in it."""
    found = 0
    stack = [(spec, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict) or depth > MAX_SPEC_DEPTH:
            raise ValueError(f"data_spec is not a pytree of at most {MAX_SPEC_DEPTH} levels")
        kind = node.get("type")
        if kind is None:
            found += 1
            continue
        children = node.get("children_spec") or []
        if kind not in _NODES or not isinstance(children, list):
            raise ValueError(f"unsupported pytree node {kind!r}")
        if kind in _NODES[:2]:
            keys = parse_json(node["context"])
            if not isinstance(keys, list) or len(keys) != len(children):
                raise ValueError("a dict node's context does not name each of its children")
            if not all(isinstance(k, str | int | float | bool) or k is None for k in keys):
                raise ValueError("a dict node's keys must be JSON scalars")
            node["keys"] = keys  # parsed once here, not per sample
        stack.extend((child, depth + 1) for child in children)
    if found != leaves:
        raise ValueError(f"data_spec has {found} leaves but data_format {leaves}")


def _unflatten(spec: dict[str, Any], leaves: list[Any], pos: int) -> tuple[Any, int]:
    kind = spec.get("type")
    children = spec.get("children_spec") or []
    if kind is None:
        return leaves[pos], pos + 1
    values = []
    for child in children:
        value, pos = _unflatten(child, leaves, pos)
        values.append(value)
    if kind in ("builtins.dict", "collections.OrderedDict"):
        return dict(zip(spec["keys"], values, strict=True)), pos
    if kind == "builtins.tuple":
        return tuple(values), pos
    if kind == "builtins.list":
        return values, pos
    raise ValueError(f"unsupported pytree node {kind!r}")


class LitDataCodec(BaseCodec):
    """Decodes LitData samples into the structure they were written with.

    Args:
        dataset: dataset name, for errors.
        config: the ``config`` object of ``index.json``.
        allow_pickle: allow the ``pickle`` serializer.

    Raises:
        FormatError: at construction, for refused or unknown serializers.
    """

    format = "litdata"

    def __init__(self, dataset: str, config: dict[str, Any], allow_pickle: bool) -> None:
        self.dataset = dataset
        self.config = config
        self.allow_pickle = allow_pickle
        self._inflated = Inflated()
        try:
            self._setup()
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise FormatError(str(exc), dataset=dataset) from None

    def _setup(self) -> None:
        formats = list(self.config["data_format"])
        self._decoders = [_leaf_decoder(name, self.allow_pickle) for name in formats]
        self._vectors = [_LEAF_VECTORS.get(name) for name in formats]
        spec = self.config.get("data_spec")
        self._spec = parse_json(spec)[1] if spec else None
        self._flat: list[Any] | None = None
        if self._spec is not None:
            _check_spec(self._spec, len(formats))
            children = self._spec.get("children_spec") or []
            if "keys" in self._spec and all(c.get("type") is None for c in children):
                self._flat = self._spec["keys"]

    def __getstate__(self) -> dict[str, Any]:
        return {"dataset": self.dataset, "config": self.config, "allow_pickle": self.allow_pickle}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._inflated = Inflated()
        self._setup()

    def use_disk_cache(self, cache: Any) -> None:
        """Keep decompressed shards in ``cache`` (a DiskCache) as well as in memory."""
        self._inflated.disk = cache

    def decode(
        self,
        shard: ShardInfo,
        index: RecordIndex | WholeIndex,
        blob: Blob,
        samples: Sequence[int],
    ) -> list[Any]:
        if isinstance(index, WholeIndex):
            index, blob = inflate_records(
                shard, index, blob, self._inflated, LITDATA_CODECS, self.dataset, raw_declared=False
            )
        n = len(self._decoders)
        columns = decode_columns(
            blob, index.offsets, samples, [None] * n, self._decoders, self._vectors
        )
        if columns is not None:
            rows = (list(leaves) for leaves in zip(*columns, strict=True))
            if not self._spec:
                return list(rows)
            if self._flat is not None:  # a dict of leaves, the common case
                return dict_rows(self._flat, columns)
            try:
                return [_unflatten(self._spec, leaves, 0)[0] for leaves in rows]
            except (ValueError, IndexError, KeyError, TypeError):
                pass  # decoded one by one below, which names the sample
        out = []
        for i in samples:
            data = blob.slice(int(index.offsets[i]), int(index.offsets[i + 1]))
            try:
                sizes = struct.unpack_from(f"<{n}I", data)
                pos = 4 * n
                leaves = []
                for decode, size in zip(self._decoders, sizes, strict=True):
                    if pos + size > len(data):
                        raise ValueError("a field runs past the end of the sample")
                    leaves.append(decode(data[pos : pos + size]))
                    pos += size
                value = _unflatten(self._spec, leaves, 0)[0] if self._spec else leaves
            except (ValueError, struct.error, IndexError, KeyError, UnicodeDecodeError) as exc:
                raise FormatError(
                    f"corrupt LitData sample ({type(exc).__name__}: {exc})",
                    dataset=self.dataset,
                    uri=shard.uri,
                    sample=i,
                ) from None
            out.append(value)
        return out

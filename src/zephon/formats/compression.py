"""Decompression for shards compressed as a whole: streamed (JSONL ``.gz``, ``.zst``,
``.bz2``, ``.xz``) or in one call (MDS ``zip_data`` shards, LitData ``.zstd.bin`` chunks).

Every failure of a codec surfaces as ``ValueError`` with the codec named, which callers turn
into a :class:`~zephon.errors.FormatError` naming the shard. Concatenated streams (``pigz``,
``pbzip2``, multi-frame zstd, multi-stream xz) decompress to the concatenation, as the
command-line tools do.
"""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections import OrderedDict
from collections.abc import Callable, Generator, Iterator
from typing import Any

import numpy as np

from zephon.refs import path_of

__all__ = [
    "MDS_CODECS",
    "Inflated",
    "StreamDecompressor",
    "decompress_whole",
    "inflate_limit",
    "stream_kind",
]

_STREAM_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}


def stream_kind(uri: str) -> str | None:
    """``"gzip"``, ``"zstd"``, ``"bz2"``, ``"xz"`` or ``None`` from a shard's extension."""
    path = path_of(uri)
    for suffix, kind in _STREAM_SUFFIXES.items():
        if path.endswith(suffix):
            return kind
    return None


def _zstd() -> Any:
    import zstandard

    return zstandard.ZstdDecompressor().decompressobj()


_STREAMS: dict[str, Callable[[], Any]] = {
    "gzip": lambda: zlib.decompressobj(wbits=47),  # gzip or zlib header, auto-detected
    "zstd": _zstd,
    "bz2": bz2.BZ2Decompressor,
    "xz": lzma.LZMADecompressor,
}


# What a compressed shard may expand to. Where its index declares the size (MDS, LitData, a
# JSONL shard indexed at discovery), that size exactly; else MAX_RATIO times its compressed
# size, and at least FLOOR_BYTES. Text compresses 3-10x (gzip) to 20-50x (xz, zstd -19);
# a bomb 1,000x (gzip's limit) to millions (bz2, xz and zstd runs of one byte).
MAX_RATIO = 1000
FLOOR_BYTES = 256 << 20
PIECE_BYTES = 16 << 20  # the most a stream decompresses in one call, whatever it holds
_ZSTD_SLICE = 4096  # zstd input per call: a block expands at most 128 KiB from 4 bytes


def inflate_limit(compressed_bytes: int, declared_bytes: int | None = None) -> int:
    """The most a shard of ``compressed_bytes`` may decompress to (see :data:`MAX_RATIO`)."""
    if declared_bytes:
        return declared_bytes
    return max(FLOOR_BYTES, MAX_RATIO * compressed_bytes)


class StreamDecompressor:
    """Incremental decompression of one of :data:`_STREAMS`, across concatenated streams,
    in pieces of at most :data:`PIECE_BYTES`; ``ValueError`` once the output passes
    ``limit`` bytes (a decompression bomb, or a shard unlike its index)."""

    def __init__(self, kind: str, limit: int | None = None) -> None:
        if kind not in _STREAMS:
            raise ValueError(f"unknown compression {kind!r} (known: {sorted(_STREAMS)})")
        self.kind = kind
        self.limit = limit
        self.total = 0
        self._obj = _STREAMS[kind]()
        self._ended = False

    def feed(self, data: bytes) -> bytes:
        """All the output of ``data`` (a whole shard's, in memory anyway)."""
        return b"".join(self.pieces(data))

    def pieces(self, data: bytes) -> Iterator[bytes]:
        """The output of ``data``, piece by piece (a scan keeps only one in memory)."""
        try:
            while data:
                if self._ended:  # another stream follows the one that ended
                    self._obj, self._ended = _STREAMS[self.kind](), False
                if self.kind == "zstd":
                    data = yield from self._zstd(data)
                else:
                    data = yield from self._bounded(data)
        except ValueError:
            raise
        except Exception as exc:  # zlib.error, ZstdError, OSError, LZMAError: the codecs' own
            raise ValueError(f"corrupt {self.kind} stream ({type(exc).__name__})") from None

    def _out(self, piece: bytes) -> bytes:
        self.total += len(piece)
        if self.limit is not None and self.total > self.limit:
            raise ValueError(
                f"{self.kind} stream decompresses past {self.limit:,} bytes (more than its "
                f"index declares, or over {MAX_RATIO}x its size: a decompression bomb)"
            )
        return piece

    def _bounded(self, data: bytes) -> Generator[bytes, None, bytes]:
        """zlib, bz2 and xz: ``max_length`` bounds each call. What follows the stream's end."""
        obj = self._obj
        piece = obj.decompress(data, PIECE_BYTES)
        while True:
            if piece:
                yield self._out(piece)
            if obj.eof:
                self._ended = True
                return bytes(obj.unused_data)
            if self.kind == "gzip":
                if not obj.unconsumed_tail:
                    return b""
                piece = obj.decompress(obj.unconsumed_tail, PIECE_BYTES)
            else:
                if obj.needs_input:
                    return b""
                piece = obj.decompress(b"", PIECE_BYTES)

    def _zstd(self, data: bytes) -> Generator[bytes, None, bytes]:
        """zstd's decompressor has no output bound: small slices of input bound each call
        (128 MiB at most from 4 KiB)."""
        obj, view = self._obj, memoryview(data)
        for at in range(0, len(view), _ZSTD_SLICE):
            piece = obj.decompress(view[at : at + _ZSTD_SLICE])
            if piece:
                yield self._out(piece)
            if obj.eof:
                self._ended = True
                return bytes(obj.unused_data) + bytes(view[at + _ZSTD_SLICE :])
        return b""

    def finish(self) -> None:
        """Raise ``ValueError`` if the last stream stopped before its end marker."""
        if not self._ended and not getattr(self._obj, "eof", True):
            raise ValueError(f"truncated {self.kind} stream")


def _stream_whole(kind: str) -> Callable[[bytes, int], bytes]:
    def run(data: bytes, limit: int) -> bytes:
        stream = StreamDecompressor(kind, limit)
        out = stream.feed(data)
        stream.finish()
        return out

    return run


def _brotli(data: bytes, limit: int) -> bytes:
    cramjam = _cramjam("brotli")
    out = np.zeros(limit + 1, np.uint8)  # pages untouched past what is written
    n = int(cramjam.brotli.decompress_into(data, out))
    if n > limit:
        raise ValueError(f"brotli data decompresses past {limit:,} bytes")
    return out[:n].tobytes()


def _snappy(data: bytes, limit: int) -> bytes:
    cramjam = _cramjam("snappy")
    declared = int(cramjam.snappy.decompress_raw_len(data))
    if declared > limit:
        raise ValueError(f"snappy data declares {declared:,} bytes, over {limit:,}")
    return bytes(cramjam.snappy.decompress_raw(data))


def _cramjam(name: str) -> Any:
    try:
        import cramjam
    except ImportError:
        raise ValueError(
            f"{name!r} compression needs cramjam: pip install 'zephon[compression]'"
        ) from None
    return cramjam


# MosaicML Streaming's shard codecs (``MDSWriter(compression="zstd:7")``, level ignored):
# each decompresses ``data`` to at most ``limit`` bytes.
MDS_CODECS: dict[str, Callable[[bytes, int], bytes]] = {
    "zstd": _stream_whole("zstd"),
    "gz": _stream_whole("gzip"),
    "bz2": _stream_whole("bz2"),
    "br": _brotli,
    "snappy": _snappy,
}


def decompress_whole(
    codec: str, data: bytes, codecs: dict[str, Callable[[bytes, int], bytes]], limit: int
) -> bytes:
    """``data`` decompressed by ``codec`` (``"name"`` or ``"name:level"``) of ``codecs``,
    to at most ``limit`` bytes (``ValueError`` past it)."""
    name = codec.split(":", 1)[0]
    if name not in codecs:
        raise ValueError(f"unknown compression {codec!r} (known: {sorted(codecs)})")
    try:
        return codecs[name](data, limit)
    except ValueError:
        raise
    except Exception as exc:  # the codec's own error types
        raise ValueError(f"corrupt {name} data ({type(exc).__name__})") from None


class Inflated:
    """The last few shards decompressed whole, by ``(uri, version)``: a compressed shard is
    decoded by every read that draws from it, and must be decompressed once, not per read.

    With ``disk`` (a :class:`~zephon.storage.DiskCache`), decompressed shards are also kept
    on local disk, shared by the node's processes and the next epochs."""

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self.disk: Any = None
        self._entries: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def get(
        self,
        key: tuple[str, str],
        inflate: Callable[[], bytes],
        parse: Callable[[bytes], Any] = lambda raw: raw,
    ) -> Any:
        """``parse(inflate())`` of the shard at ``key = (uri, version)``, computed once."""
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
            return value
        uri, version = key[0] + "#inflated", key[1]
        raw = self.disk.get(uri, version, 0, 1 << 62) if self.disk is not None else None
        if raw is None:
            raw = inflate()
            if self.disk is not None:
                self.disk.put(uri, version, 0, raw, end=len(raw))
        value = parse(raw)
        self._entries[key] = value
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)
        return value

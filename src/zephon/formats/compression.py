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
from collections.abc import Callable
from typing import Any

from zephon.refs import path_of

__all__ = [
    "MDS_CODECS",
    "Inflated",
    "StreamDecompressor",
    "decompress_whole",
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


class StreamDecompressor:
    """Incremental decompression of one of :data:`_STREAMS`, across concatenated streams."""

    def __init__(self, kind: str) -> None:
        if kind not in _STREAMS:
            raise ValueError(f"unknown compression {kind!r} (known: {sorted(_STREAMS)})")
        self.kind = kind
        self._obj = _STREAMS[kind]()
        self._ended = False

    def feed(self, data: bytes) -> bytes:
        out = []
        try:
            while data:
                if self._ended:  # another stream follows the one that ended
                    self._obj, self._ended = _STREAMS[self.kind](), False
                out.append(self._obj.decompress(data))
                if not getattr(self._obj, "eof", False):
                    break
                self._ended = True
                data = getattr(self._obj, "unused_data", b"")
        except Exception as exc:  # zlib.error, ZstdError, OSError, LZMAError: the codecs' own
            raise ValueError(f"corrupt {self.kind} stream ({type(exc).__name__})") from None
        return b"".join(out)

    def finish(self) -> None:
        """Raise ``ValueError`` if the last stream stopped before its end marker."""
        if not self._ended and not getattr(self._obj, "eof", True):
            raise ValueError(f"truncated {self.kind} stream")


def _stream_whole(kind: str) -> Callable[[bytes], bytes]:
    def run(data: bytes) -> bytes:
        stream = StreamDecompressor(kind)
        out = stream.feed(data)
        stream.finish()
        return out

    return run


def _cramjam(name: str, call: str) -> Callable[[bytes], bytes]:
    def run(data: bytes) -> bytes:
        try:
            import cramjam
        except ImportError:
            raise ValueError(
                f"{name!r} compression needs cramjam: pip install 'zephon[compression]'"
            ) from None
        return bytes(getattr(getattr(cramjam, name), call)(data))

    return run


# MosaicML Streaming's shard codecs (``MDSWriter(compression="zstd:7")``, level ignored).
MDS_CODECS: dict[str, Callable[[bytes], bytes]] = {
    "zstd": _stream_whole("zstd"),
    "gz": _stream_whole("gzip"),
    "bz2": _stream_whole("bz2"),
    "br": _cramjam("brotli", "decompress"),
    "snappy": _cramjam("snappy", "decompress_raw"),
}


def decompress_whole(codec: str, data: bytes, codecs: dict[str, Callable[[bytes], bytes]]) -> bytes:
    """``data`` decompressed by ``codec`` (``"name"`` or ``"name:level"``) of ``codecs``."""
    name = codec.split(":", 1)[0]
    if name not in codecs:
        raise ValueError(f"unknown compression {codec!r} (known: {sorted(codecs)})")
    try:
        return codecs[name](data)
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

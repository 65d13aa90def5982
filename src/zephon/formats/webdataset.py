"""WebDataset: tar files where the members sharing a key (the basename up to its first dot)
form one sample, ``{"__key__": key, ext: bytes, ...}``.

The index is built by one streaming pass over the tar headers (member data is skipped, never
kept); a sample's span runs from its first member's header to the end of its last member's
padded data, so a sample is one range read and neighbouring samples coalesce.
"""

from __future__ import annotations

import tarfile
import zlib
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from zephon.errors import FormatError
from zephon.formats.blob import Blob, Bytes
from zephon.formats.codec import BaseCodec
from zephon.formats.index import RecordIndex
from zephon.formats.tarblocks import (
    MAX_EXTENDED_HEADER,
    Members,
    pax_path,
    plain_entries,
    sample_members,
)
from zephon.refs import ShardInfo

__all__ = ["TarIndexer", "WebDatasetCodec", "split_key"]

_BLOCK = 512
_FILE_TYPES = {tarfile.REGTYPE, tarfile.AREGTYPE, tarfile.CONTTYPE}
_NAME_TYPES = {tarfile.GNUTYPE_LONGNAME, tarfile.XHDTYPE}
_ZERO_BLOCK = bytes(_BLOCK)


class _Header:
    __slots__ = ("name", "size", "type")

    def __init__(self, name: str, size: int, type: bytes) -> None:
        self.name, self.size, self.type = name, size, type


def _header(block: bytes) -> _Header | None:
    """The name, size and type of a plain ustar or GNU header, about ten times faster than
    ``tarfile``'s full parse (which dominated scanning a tar of small members); ``None`` for
    anything else (base-256 sizes, a bad checksum), which ``tarfile`` then judges.

    The checksum (the sum of the block's bytes, its own field counted as spaces) is compared
    modulo 65,521 through Adler-32, whose low half is one plus that sum: C speed instead of a
    Python sum over 512 bytes, and a block that is no header still passes only once in
    65,521 (a sum is at most 130,560, so a wrong one differs from the right one by at most
    one such step)."""
    magic = block[257:263]
    if magic not in (b"ustar\x00", b"ustar "):
        return None
    try:
        size = int(block[124:136].rstrip(b"\x00 ") or b"0", 8)
        checksum = int(block[148:156].rstrip(b"\x00 "), 8)
    except ValueError:
        return None
    byte_sum = (zlib.adler32(block) & 0xFFFF) - 1 - sum(block[148:156]) + 256
    if (byte_sum - checksum) % 65521:
        return None
    name = block[:100].split(b"\x00", 1)[0]
    if magic == b"ustar\x00" and block[345] != 0:  # POSIX ustar: a prefix before the name
        name = block[345:500].split(b"\x00", 1)[0] + b"/" + name
    kind = block[156:157] or tarfile.REGTYPE
    return _Header(name.decode("utf-8", "surrogateescape"), size, kind)


def _full_header(block: bytes, header_at: int) -> Any:
    try:
        return tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
    except tarfile.HeaderError as exc:
        raise ValueError(f"bad tar header at byte {header_at}: {exc}") from None


def _padded(size: int) -> int:
    return (size + _BLOCK - 1) // _BLOCK * _BLOCK


def split_key(name: str) -> tuple[str, str]:
    """``"dir/0001.jpg.json"`` -> ``("dir/0001", "jpg.json")``: WebDataset's key convention."""
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    if dot < 0:
        return name, ""
    return name[:dot], name[dot + 1 :]


class TarIndexer:
    """Parses tar headers from a stream fed chunk by chunk, in order, keeping no member data.

    After ``finish()``, :attr:`members` lists ``(header_offset, name, data_offset, size)``.
    """

    def __init__(self, base: int = 0) -> None:
        self.members: list[tuple[int, str, int, int]] = []
        self._buf = b""
        self._pos = base  # absolute offset of _buf[0]
        self._skip = 0  # bytes still to drop before the next header
        self._pending_name: str | None = None
        self._entry_start: int | None = None  # where the extended header of the next member began
        self._need_data: tuple[bytes, int, int] | None = None  # (type, size, header_offset)
        self.ended = False

    def feed(self, chunk: bytes) -> None:
        if self.ended:
            return
        if self._skip >= len(chunk):
            self._skip -= len(chunk)
            self._pos += len(chunk)
            return
        if self._skip:
            chunk = chunk[self._skip :]
            self._pos += self._skip
            self._skip = 0
        self._buf = self._buf + chunk if self._buf else chunk
        self._parse()

    def _parse(self) -> None:
        buf, at = self._buf, 0
        if self._need_data is None and self._entry_start is None and self._pending_name is None:
            # plain headers many at a time; what follows them, one at a time below
            at, found = plain_entries(buf, self._pos)
            self.members += found
        while not self.ended:
            if self._need_data is not None:
                kind, size, header_at = self._need_data
                if len(buf) - at < _padded(size):
                    break
                data = buf[at : at + size]
                if kind == tarfile.GNUTYPE_LONGNAME:
                    self._pending_name = data.rstrip(b"\0").decode("utf-8")
                else:
                    self._pending_name = pax_path(data) or self._pending_name
                at += _padded(size)
                self._need_data = None
                continue
            if len(buf) - at < _BLOCK:
                break
            block = buf[at : at + _BLOCK]
            header_at = self._pos + at
            if block == _ZERO_BLOCK:
                self.ended = True
                break
            info = _header(block) or _full_header(block, header_at)
            at += _BLOCK
            if info.type in _NAME_TYPES:
                if info.size > MAX_EXTENDED_HEADER:
                    raise ValueError(
                        f"tar extended header at byte {header_at} declares {info.size:,} bytes "
                        f"(over {MAX_EXTENDED_HEADER:,})"
                    )
                self._entry_start = header_at if self._entry_start is None else self._entry_start
                self._need_data = (info.type, info.size, header_at)
                continue
            start = self._entry_start if self._entry_start is not None else header_at
            name = self._pending_name or info.name
            self._pending_name, self._entry_start = None, None
            if info.type in _FILE_TYPES:
                self.members.append((start, name, self._pos + at, info.size))
            padded = _padded(info.size)  # every entry type stores its data padded to blocks
            if len(buf) - at >= padded:
                at += padded
            else:
                self._skip = padded - (len(buf) - at)
                at = len(buf)
        self._buf = buf[at:]
        self._pos += at

    def finish(self) -> None:
        if self._need_data is not None or self._skip or (not self.ended and any(self._buf)):
            raise ValueError("tar stream ends inside a member")


def sample_offsets(members: Sequence[tuple[int, str, int, int]], end: int) -> np.ndarray:
    """Offsets of samples (runs of members sharing a key) for a :class:`RecordIndex`."""
    starts: list[int] = []
    last_key: str | None = None
    for header_at, name, _, _ in members:
        key, _ = split_key(name)
        if key != last_key:
            starts.append(header_at)
            last_key = key
    if members:
        _, _, data_at, size = members[-1]
        end = data_at + _padded(size)
    return np.array([*starts, end], dtype=np.int64)


def _members_in(view: memoryview, base: int) -> Iterator[tuple[str, memoryview]]:
    """The file members of a sample's span (``view``, at byte ``base`` of its shard): each
    name (a GNU long name or PAX path before it applies) and its data, not copied."""
    at, pending = 0, None
    while len(view) - at >= _BLOCK:
        block = bytes(view[at : at + _BLOCK])
        if block == _ZERO_BLOCK:
            return
        info = _header(block) or _full_header(block, base + at)
        at += _BLOCK
        if at + info.size > len(view):
            raise ValueError(f"tar member at byte {base + at - _BLOCK} ends past its sample")
        data = view[at : at + info.size]
        at += _padded(info.size)
        if info.type in _NAME_TYPES and info.size > MAX_EXTENDED_HEADER:
            raise ValueError(f"tar extended header at byte {base + at - _BLOCK} is too large")
        if info.type == tarfile.GNUTYPE_LONGNAME:
            pending = bytes(data).rstrip(b"\0").decode("utf-8")
        elif info.type == tarfile.XHDTYPE:
            pending = pax_path(bytes(data)) or pending
        else:
            if info.type in _FILE_TYPES:
                yield pending or info.name, data
            pending = None


class WebDatasetCodec(BaseCodec):
    """Decodes WebDataset samples into ``{"__key__": key, ext: bytes}``."""

    format = "webdataset"

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset

    def decode(
        self, shard: ShardInfo, index: RecordIndex, blob: Blob, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        """The samples' members found a round of headers at a time (:mod:`tarblocks`); a
        sample with an unusual or damaged header is parsed one header at a time."""
        out: list[dict[str, Any] | None] = [None] * len(samples)
        wanted = np.asarray(samples, dtype=np.int64)
        starts, stops = index.offsets[wanted], index.offsets[wanted + 1]
        for base, data in blob.parts:
            inside = np.flatnonzero((starts >= base) & (stops <= base + len(data)))
            if not inside.size:
                continue
            found = sample_members(
                np.frombuffer(data, np.uint8), starts[inside] - base, stops[inside] - base
            )
            for i, sample in self._assembled(shard, wanted[inside], data, found):
                out[inside[i]] = sample
        for i, got in enumerate(out):
            if got is None:
                out[i] = self._decode_one(shard, index, blob, int(wanted[i]))
        return out  # type: ignore[return-value]

    def _assembled(
        self, shard: ShardInfo, ids: np.ndarray, data: Bytes, found: Members
    ) -> Iterator[tuple[int, dict[str, Any]]]:
        """The samples ``found`` read whole, as ``(position, sample)``: the hot loop of a tar
        epoch, a few operations per member."""
        raw = data if isinstance(data, bytes) else memoryview(data)
        copy = raw.__getitem__ if isinstance(raw, bytes) else lambda at: bytes(raw[at])
        sample: dict[str, Any] = {}
        current, done = -1, False
        for i, name_at, name_end, data_at, data_end in zip(
            *(c.tolist() for c in found[:5]), strict=True
        ):
            name = str(copy(slice(name_at, name_end)), "utf-8", "surrogateescape")
            key, ext = split_key(name)
            if i != current:
                if sample:
                    yield current, sample
                current, sample, done = i, {"__key__": key}, False
            elif done or key != sample["__key__"]:
                done = True  # the sample's span also holds trailing padding entries
                continue
            if ext in sample:
                raise FormatError(
                    _twice(ext, key, name), dataset=self.dataset, uri=shard.uri, sample=int(ids[i])
                )
            sample[ext] = copy(slice(data_at, data_end))
        if sample:
            yield current, sample

    def _decode_one(
        self, shard: ShardInfo, index: RecordIndex, blob: Blob, i: int
    ) -> dict[str, Any]:
        start, stop = int(index.offsets[i]), int(index.offsets[i + 1])
        sample: dict[str, Any] = {}
        try:
            for name, data in _members_in(blob.slice(start, stop), start):
                key, ext = split_key(name)
                if "__key__" in sample and key != sample["__key__"]:
                    break  # the sample's span also holds trailing padding entries
                sample["__key__"] = key
                if ext in sample:  # one would hide the other (or the key): never silently
                    raise ValueError(_twice(ext, key, name))
                sample[ext] = bytes(data)
        except ValueError as exc:
            raise FormatError(str(exc), dataset=self.dataset, uri=shard.uri, sample=i) from None
        if "__key__" not in sample:
            raise FormatError(
                "no tar member where the index put a sample",
                dataset=self.dataset,
                uri=shard.uri,
                sample=i,
            )
        return sample


def _twice(ext: str, key: str, name: str) -> str:
    what = "the key's" if ext == "__key__" else "two members'"
    return f"sample {key!r}: {what} name {name!r} twice"

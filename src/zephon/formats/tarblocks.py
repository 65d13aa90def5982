"""Tar headers read many at a time: the members of a run of WebDataset samples (decoding),
and the entries a discovery scan lists (:func:`plain_entries`), found with a few numpy passes
instead of a Python parse per header.

Only the plainest header is taken here: ``ustar`` magic, no name prefix, a size and a
checksum written as octal digits ended by NULs or spaces (what Python's ``tarfile``, GNU tar
and every WebDataset writer produce), the checksum exact; and PAX headers that rename
nothing (WebDataset's writer puts one with the ``mtime`` before every member). A sample with
any other header (a long name, a PAX path, base-256 sizes, a damaged block, a member running
past its span) is reported for the one-header-at-a-time parser, which judges it and names
the error.
"""

from __future__ import annotations

import tarfile
from typing import NamedTuple

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["MAX_EXTENDED_HEADER", "Members", "pax_path", "plain_entries", "sample_members"]

_BLOCK = 512
# A GNU long name or a PAX header is held whole until parsed: a header declaring terabytes
# would have the scan keep the rest of the shard in memory.
MAX_EXTENDED_HEADER = 1 << 20
_PAX = tarfile.XHDTYPE[0]
_EXTENDED = np.frombuffer(tarfile.GNUTYPE_LONGNAME + tarfile.XGLTYPE, np.uint8)
_FILES = np.frombuffer(tarfile.REGTYPE + tarfile.AREGTYPE + tarfile.CONTTYPE, np.uint8)
_POSIX = np.frombuffer(b"ustar\x00", np.uint8)
_GNU = np.frombuffer(b"ustar ", np.uint8)


class Members(NamedTuple):
    """File members found (directories and other entries left out), in order within each
    sample: ``sample`` (its position among the samples asked for), where its name starts and
    ends, where its data starts and ends; ``fallback`` marks the samples to parse one header
    at a time (none of their members is listed)."""

    sample: np.ndarray
    name_at: np.ndarray
    name_end: np.ndarray
    data_at: np.ndarray
    data_end: np.ndarray
    fallback: np.ndarray


def pax_path(data: bytes) -> str | None:
    """The ``path`` a PAX extended header gives the member after it, if any."""
    pos = 0
    while pos < len(data):
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        if length <= space - pos:  # a record holds at least its own length: else no progress
            raise ValueError(f"bad PAX record length {length}")
        record = data[space + 1 : pos + length - 1]
        key, _, value = record.partition(b"=")
        if key == b"path":
            return value.decode("utf-8")
        pos += length
    return None


def _octal(field: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values of ``n x w`` octal fields and whether each is plain: one or more digits
    from the first byte, then only NULs and spaces."""
    digit = (field >= ord("0")) & (field <= ord("7"))
    width = field.shape[1]
    ends = np.where(digit.all(axis=1), width, np.argmin(digit, axis=1))
    after = np.arange(width) >= ends[:, None]
    plain = digit[:, 0] & np.all(~after | (field == 0) | (field == ord(" ")), axis=1)
    digits = np.where(after, 0, field.astype(np.int64) - ord("0"))
    weights = np.int64(8) ** np.arange(width - 1, -1, -1, dtype=np.int64)
    return (digits @ weights) >> (3 * (width - ends)), plain


def _plain_pax(data: np.ndarray, at: int, size: int) -> bool:
    """Whether a PAX header changes nothing read here (no ``path``): the one-header parser
    takes the rest, and judges a malformed one."""
    if size > MAX_EXTENDED_HEADER:
        return False
    try:
        return pax_path(data[at : at + size].tobytes()) is None
    except ValueError:
        return False


def _check_paxes(
    data: np.ndarray,
    windows: np.ndarray,
    pax: np.ndarray,
    ok: np.ndarray,
    body: np.ndarray,
    size: np.ndarray,
) -> None:
    """Clear ``ok`` for the PAX headers (rows ``pax``) that rename their member. WebDataset
    writes one per member: the single-block ones are searched together for a ``path``
    record (one search instead of a parse each); a match, or a longer header, is parsed."""
    rows = np.flatnonzero(pax)
    small = rows[(size[rows] <= _BLOCK) & (body[rows] + _BLOCK <= len(data))]
    if small.size and _PAX_PATH not in windows[body[small]].tobytes():
        rows = np.setdiff1d(rows, small, assume_unique=True)
    for row in rows.tolist():
        ok[row] = _plain_pax(data, int(body[row]), int(size[row]))


def _plain_headers(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(ok, size, name_len)`` of ``n x 512`` header blocks."""
    magic = blocks[:, 257:263]
    posix = np.all(magic == _POSIX, axis=1)
    ok = (posix | np.all(magic == _GNU, axis=1)) & ~(posix & (blocks[:, 345] != 0))
    size, plain_size = _octal(blocks[:, 124:136])
    checksum, plain_checksum = _octal(blocks[:, 148:156])
    byte_sum = blocks.sum(axis=1, dtype=np.int64) - blocks[:, 148:156].sum(axis=1) + 8 * 32
    ok &= plain_size & plain_checksum & (byte_sum == checksum)
    name = blocks[:, :100]
    name_len = np.where(np.all(name != 0, axis=1), 100, np.argmin(name != 0, axis=1))
    return ok, size, name_len


def sample_members(data: np.ndarray, starts: np.ndarray, stops: np.ndarray) -> Members:
    """The members of the samples spanning ``[starts[i], stops[i])`` of ``data`` (uint8),
    offsets relative to ``data``: a round per member position, each reading that member's
    header for every sample still holding one."""
    count = len(starts)
    fallback = np.zeros(count, dtype=bool)
    windows = sliding_window_view(data, _BLOCK) if len(data) >= _BLOCK else None
    at = starts.astype(np.int64)
    active = np.flatnonzero(stops - at >= _BLOCK)
    rounds: list[tuple[np.ndarray, ...]] = []
    while active.size and windows is not None:
        head = at[active]
        blocks = windows[head]
        ok, size, name_len = _plain_headers(blocks)
        kind = blocks[:, 156]
        body = head + _BLOCK
        ok &= (body + size <= stops[active]) & ~np.isin(kind, _EXTENDED)
        _check_paxes(data, windows, ok & (kind == _PAX), ok, body, size)
        fallback[active[~ok]] = True
        good = active[ok]
        body, size = body[ok], size[ok]
        file = np.isin(kind[ok], _FILES)
        rounds.append(
            (
                good[file],
                head[ok][file],
                (head + name_len)[ok][file],
                body[file],
                (body + size)[file],
            )
        )
        at[good] = body + (size + _BLOCK - 1) // _BLOCK * _BLOCK
        active = good[stops[good] - at[good] >= _BLOCK]
    if not rounds:
        empty = np.zeros(0, dtype=np.int64)
        return Members(empty, empty, empty, empty, empty, fallback)
    columns = [np.concatenate(c) for c in zip(*rounds, strict=True)]
    order = np.argsort(columns[0], kind="stable")  # rounds in order within each sample
    columns = [c[order] for c in columns]
    keep = ~fallback[columns[0]]
    sample, name_at, name_end, data_at, data_end = (c[keep] for c in columns)
    return Members(sample, name_at, name_end, data_at, data_end, fallback)


_PAX_PATH = b" path="  # how a PAX record naming the member's path starts, after its length


def plain_entries(raw: bytes, base: int) -> tuple[int, list[tuple[int, str, int, int]]]:
    """The run of plain entries that ``raw`` (at shard byte ``base``) starts with, as
    the streaming scan lists file members, ``(start, name, data_at, size)``, and the bytes
    they take; the scan parses what follows (an odd header, the archive's end, an entry cut
    by the end of ``raw``) one header at a time.

    A block with the ``ustar`` magic is a candidate header; a run is a chain of them where each
    entry's data ends where the next candidate begins, every header plain and exact (see the
    module docs) and every PAX header a single block that renames nothing: a candidate inside
    some member's data (a tar stored in a tar) breaks the chain, and the scan takes it from
    there. A member's start is its PAX header's, when one comes before it."""
    count = len(raw) // _BLOCK
    if count < 2:
        return 0, []
    blocks = np.frombuffer(raw, np.uint8, count * _BLOCK).reshape(count, _BLOCK)
    magic = blocks[:, 257:263]
    head = np.flatnonzero(np.all(magic == _POSIX, axis=1) | np.all(magic == _GNU, axis=1))
    if not head.size or head[0] != 0:
        return 0, []
    ok, size, name_len = _plain_headers(blocks[head])
    kind = blocks[head, 156]
    following = head + 1 + (size + _BLOCK - 1) // _BLOCK
    pax = kind == _PAX
    ok &= ~np.isin(kind, _EXTENDED) & ~(pax & (size > _BLOCK))
    ok[:-1] &= following[:-1] == head[1:]  # the chain: each entry ends at the next header
    ok[-1] = False  # the last may run past ``raw``: the scan sees it whole
    ok[:-1] &= ~(pax[:-1] & pax[1:])  # a PAX header precedes a member, not another one
    run = int(np.argmin(ok))  # the first entry that is not part of the run
    if run and pax[run - 1]:  # a PAX header goes with its member
        run -= 1
    if not run:
        return 0, []
    paxes = head[:run][pax[:run]] + 1
    if paxes.size:
        records = blocks[paxes].tobytes()
        if _PAX_PATH in records:  # some PAX header may rename its member: header by header
            return 0, []
    offsets = (head[:run] * _BLOCK).tolist()
    ends = (head[:run] * _BLOCK + name_len[:run]).tolist()
    sizes = size[:run].tolist()
    files = np.isin(kind[:run], _FILES).tolist()
    renamed = [False, *pax[: run - 1].tolist()]
    members = []
    for i in range(run):
        if files[i]:
            at = offsets[i]
            start = offsets[i - 1] if renamed[i] else at
            name = raw[at : ends[i]].decode("utf-8", "surrogateescape")
            members.append((base + start, name, base + at + _BLOCK, sizes[i]))
    return int(head[run]) * _BLOCK, members

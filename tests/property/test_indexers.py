"""Streaming index builders give the same index however the stream is chunked."""

from __future__ import annotations

import io
import itertools
import tarfile

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.formats.index import RecordIndex, StreamIndex, index_from_bytes
from zephon.formats.jsonl import LineIndexer
from zephon.formats.webdataset import TarIndexer


def _chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _reference_starts(data: bytes) -> list[int]:
    starts, pos = [], 0
    for line in data.split(b"\n"):
        if line.strip():
            starts.append(pos)
        pos += len(line) + 1
    return starts


lines = st.lists(
    st.one_of(
        st.just(b""),
        st.just(b"   "),
        st.just(b"\r"),
        st.binary(min_size=1, max_size=30).filter(lambda b: b"\n" not in b),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(lines, st.lists(st.integers(min_value=0), max_size=12), st.booleans())
def test_line_index_is_independent_of_chunking(
    parts: list[bytes], cuts: list[int], trailing_newline: bool
) -> None:
    data = b"\n".join(parts) + (b"\n" if trailing_newline else b"")
    indexer = LineIndexer()
    for chunk in _chunked(data, cuts):
        indexer.feed(chunk)
    offsets = indexer.finish()
    assert offsets.tolist() == [*_reference_starts(data), len(data)]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(0, 1500)), min_size=1, max_size=8),
    st.lists(st.integers(min_value=0), max_size=10),
    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]),
)
def test_tar_index_is_independent_of_chunking(
    members: list[tuple[int, int]], cuts: list[int], fmt: int
) -> None:
    buf = io.BytesIO()
    names = []
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i, (name_len, size) in enumerate(members):
            name = f"{i:03d}" + "n" * (
                min(name_len, 90) if fmt == tarfile.USTAR_FORMAT else name_len
            )
            info = tarfile.TarInfo(name + ".bin")
            info.size = size
            tar.addfile(info, io.BytesIO(bytes([i % 256]) * size))
            names.append(info.name)
    data = buf.getvalue()
    indexer = TarIndexer()
    for chunk in _chunked(data, cuts):
        indexer.feed(chunk)
    indexer.finish()
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar]
    assert [(n, d, s) for _, n, d, s in indexer.members] == expected


@given(st.lists(st.integers(0, 2**40), max_size=50))
def test_index_serialisation_round_trips(values: list[int]) -> None:
    offsets = np.array(sorted(values), dtype=np.int64)
    for index in (RecordIndex(offsets), StreamIndex(offsets, 12345)):
        back = index_from_bytes(index.to_bytes())
        assert type(back) is type(index)
        assert back.offsets.tolist() == offsets.tolist()


@settings(max_examples=200, deadline=None)
@given(
    st.text(min_size=1, max_size=99).filter(lambda n: "\x00" not in n),
    st.integers(0, 8**11 - 1),
    st.integers(0, 511),
    st.integers(1, 255),
)
def test_tar_header_checksum_agrees_with_tarfile(
    name: str, size: int, flip_at: int, flip_by: int
) -> None:
    """The fast header path takes what tarfile takes and refuses a changed byte that tarfile
    refuses (outside the checksum field, every change moves the sum)."""
    from zephon.formats.webdataset import _header

    info = tarfile.TarInfo(name)
    info.size = size
    try:
        block = info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "surrogateescape")[:512]
    except ValueError:  # a name ustar cannot hold
        return
    fast = _header(block)
    assert fast is not None and fast.size == size
    changed = bytearray(block)
    changed[flip_at] = (changed[flip_at] + flip_by) % 256
    try:
        tarfile.TarInfo.frombuf(bytes(changed), "utf-8", "surrogateescape")
        accepted = True
    except tarfile.HeaderError:
        accepted = False
    if not accepted:
        assert _header(bytes(changed)) is None


def _tar_of(entries: list[tuple[str, int, bool]], fmt: int) -> bytes:
    """A tar of ``entries`` (name, size, a tar stored inside: headers in its data) in
    ``fmt``, with a directory entry first."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        folder = tarfile.TarInfo("d")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, size, nested in entries:
            if nested:  # a member whose bytes are a tar: its headers look like ours
                inner = io.BytesIO()
                with tarfile.open(fileobj=inner, mode="w", format=fmt) as t:
                    member = tarfile.TarInfo("inner.txt")
                    member.size = size
                    t.addfile(member, io.BytesIO(b"i" * size))
                body = inner.getvalue()
            else:
                body = bytes([len(name) % 256]) * size
            info = tarfile.TarInfo(name)
            info.size = len(body)
            info.mtime = 1_700_000_000.25 if size % 2 else 0  # in PAX, a header of its own
            tar.addfile(info, io.BytesIO(body))
    return buf.getvalue()


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a.json", "a.jpg", "b/c.txt", "x" * 120 + ".bin", "é.json"]),
            st.integers(0, 2000),
            st.booleans(),
        ),
        min_size=1,
        max_size=12,
    ),
    st.lists(st.integers(min_value=0), max_size=8),
    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]),
)
def test_tar_headers_read_many_at_a_time_give_what_one_at_a_time_gives(
    entries: list[tuple[str, int, bool]], cuts: list[int], fmt: int
) -> None:
    """The scan's batch path (plain headers in numpy) lists exactly the members, starts
    included, that the header-by-header parser lists: over long names, PAX headers that
    rename, directories, tars stored inside members and any chunking of the stream."""
    from zephon.formats import webdataset

    if fmt == tarfile.USTAR_FORMAT:
        entries = [(n[:90], size, nested) for n, size, nested in entries]
    data = _tar_of(entries, fmt)

    def scan() -> list[tuple[int, str, int, int]]:
        indexer = TarIndexer()
        for chunk in _chunked(data, cuts):
            indexer.feed(chunk)
        indexer.finish()
        return indexer.members

    batched = scan()
    original = webdataset.plain_entries
    webdataset.plain_entries = lambda data, base: (0, [])  # type: ignore[assignment]
    try:
        one_by_one = scan()
    finally:
        webdataset.plain_entries = original
    assert batched == one_by_one
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        expected = [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]
    assert [(n, d, s) for _, n, d, s in batched] == expected

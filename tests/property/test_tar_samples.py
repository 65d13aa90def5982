"""WebDataset samples decoded a run at a time (headers read by numpy a round per member)
equal the same samples parsed one header at a time, on tars of every header kind Python's
``tarfile`` writes (ustar with name prefixes, GNU long names, PAX paths, directories,
trailing entries of another key inside a span) and on those tars with bytes changed: either
both give the same samples, or the run raises the FormatError that sample raises alone."""

from __future__ import annotations

import io
import tarfile
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from zephon.errors import FormatError
from zephon.formats.blob import Blob
from zephon.formats.index import RecordIndex
from zephon.formats.webdataset import TarIndexer, WebDatasetCodec, sample_offsets
from zephon.refs import ShardInfo

member = st.tuples(
    st.sampled_from(["txt", "json", "jpg", "cls", "a.b", "txt"]),  # "txt" twice: a clash
    st.integers(0, 1400),
    st.sampled_from(["file", "file", "file", "dir"]),
)
sample = st.tuples(st.integers(0, 130), st.lists(member, min_size=1, max_size=3))


def _tar(samples: list[tuple[int, list[Any]]], fmt: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for i, (name_len, members) in enumerate(samples):
            stem = "d" * (name_len // 2) + "/" + f"{i:04d}" + "k" * (name_len // 2)
            if fmt == tarfile.USTAR_FORMAT and len(stem) > 90:  # ustar: prefix + 100-byte name
                stem = stem[-90:]
            for j, (ext, size, kind) in enumerate(members):
                info = tarfile.TarInfo(f"{stem}.{ext}")
                info.mtime = 1.5 + i  # a PAX tar then holds an mtime record per member
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    tar.addfile(info)
                    continue
                info.size = size
                tar.addfile(info, io.BytesIO(bytes([(i + j) % 256]) * size))
    return buf.getvalue()


def _index(data: bytes) -> RecordIndex | None:
    indexer = TarIndexer()
    indexer.feed(data)
    indexer.finish()
    if not indexer.members:
        return None
    _, _, data_at, size = indexer.members[-1]
    return RecordIndex(sample_offsets(indexer.members, data_at + -(-size // 512) * 512))


def _outcome(call: Any) -> Any:
    try:
        return call()
    except FormatError as exc:
        return ("error", str(exc), exc.sample)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(sample, min_size=1, max_size=12),
    st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT]),
    st.lists(
        st.tuples(st.integers(0, 1 << 16), st.integers(0, 1100), st.integers(1, 255)), max_size=3
    ),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_a_run_decodes_as_its_samples_one_by_one(
    samples: list[tuple[int, list[Any]]],
    fmt: int,
    changes: list[tuple[int, int, int]],
    merge: bool,
    rng: Any,
) -> None:
    data = bytearray(_tar(samples, fmt))
    index = _index(bytes(data))
    if index is None:
        return
    if merge and len(index.offsets) > 2:  # spans holding trailing entries of the next key
        index = RecordIndex(np.delete(index.offsets, range(1, len(index.offsets) - 1, 2)))
    for sample_at, at, by in changes:  # into a sample's first headers (and PAX records)
        at = (int(index.offsets[sample_at % (len(index.offsets) - 1)]) + at) % len(data)
        data[at] = (data[at] + by) % 256
    n = len(index.offsets) - 1
    wanted = sorted(rng.sample(range(n), rng.randint(1, n)))
    cut = int(index.offsets[rng.randint(0, n)])  # two fetched ranges, split at a sample
    blob = Blob(
        [(0, bytes(data[:cut])), (cut, memoryview(bytes(data[cut:])))]
        if cut
        else [(0, bytes(data))]
    )
    codec, shard = WebDatasetCodec("wds"), ShardInfo("mem://a.tar", 0, len(data), "1")
    alone = [_outcome(lambda i=i: codec._decode_one(shard, index, blob, i)) for i in wanted]
    together = _outcome(lambda: codec.decode(shard, index, blob, wanted))
    failed = [a for a in alone if isinstance(a, tuple)]
    if not failed:
        assert together == alone
    else:
        assert isinstance(together, tuple) and together in failed


def test_plain_headers_are_read_without_the_one_by_one_parser(monkeypatch: Any) -> None:
    """The fast path is taken: on a tar written as WebDataset's writer does (a PAX header
    with the mtime before every member), no header goes to the slow one."""
    from zephon.formats import webdataset

    data = _tar([(10, [("txt", 5, "file"), ("json", 700, "file")])] * 3, tarfile.PAX_FORMAT)
    assert data.count(b"mtime=") == 6
    index = _index(data)
    called = []
    monkeypatch.setattr(webdataset, "_members_in", lambda *a: called.append(a) or iter(()))
    shard = ShardInfo("mem://a.tar", 0, len(data), "1")
    out = WebDatasetCodec("wds").decode(shard, index, Blob([(0, data)]), [0, 1, 2])
    assert called == [] and [sorted(s) for s in out] == [["__key__", "json", "txt"]] * 3
    assert out[0]["json"] == bytes([1]) * 700

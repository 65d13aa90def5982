"""MDS and LitData samples decoded column by column (a batch at once) equal the same samples
decoded one by one, on the fixtures' shards (every MDS encoding the fixtures hold: bytes,
str_int, int, json, float32, uint8, str, ndarray; LitData's int, str, float, bytes, numpy,
bool) and on those shards with bytes changed: either both give the same values, or both
raise a FormatError naming the same sample."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import _litdata_codec, _mds_codec
from zephon.errors import FormatError
from zephon.formats import records
from zephon.formats.blob import Blob
from zephon.refs import ShardInfo

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "data"
SHARDS = {
    "mds": (_mds_codec, "fuzz/shard.mds", FIXTURES / "mds" / "shard.00000.mds"),
    "litdata": (_litdata_codec, "chunk.bin", FIXTURES / "litdata" / "chunk-0-0.bin"),
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return type(a) is type(b) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    if isinstance(a, dict):
        return type(b) is dict and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and (a == b or (a != a and b != b))  # NaN equals NaN here


def _decoded(codec: Any, shard: ShardInfo, index: Any, data: bytes, samples: list[int]) -> Any:
    try:
        return codec.decode(shard, index, Blob([(0, data)]), samples)
    except FormatError as exc:
        return ("error", exc.sample)


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(sorted(SHARDS)),
    st.lists(st.tuples(st.integers(0, 1 << 20), st.integers(1, 255)), max_size=4),
    st.randoms(use_true_random=False),
)
def test_a_batch_decodes_as_its_samples_one_by_one(
    fmt: str, changes: list[tuple[int, int]], rng: Any
) -> None:
    make, name, path = SHARDS[fmt]
    codec, n = make()
    data = bytearray(path.read_bytes())
    index = records.parse_offsets_header(bytes(data), n, len(data))
    header = records.header_bytes(n)
    for at, by in changes:  # past the offsets header: the samples' own bytes
        pos = header + at % (len(data) - header)
        data[pos] = (data[pos] + by) % 256
    shard = ShardInfo(name, n, len(data), "v")
    samples = list(range(n))
    rng.shuffle(samples)
    batch = _decoded(codec, shard, index, bytes(data), samples)
    alone = []
    for i in samples:
        one = _decoded(codec, shard, index, bytes(data), [i])
        if isinstance(one, tuple):
            alone = one  # the first bad sample in the batch's order
            break
        alone.extend(one)
    assert _same(batch, alone) if not isinstance(alone, tuple) else batch == alone
    if not changes:
        assert not isinstance(batch, tuple) and len(batch) == n
        assert _columns(fmt, codec, name, index, bytes(data), samples) is not None  # not one by one


def _columns(fmt: str, codec: Any, name: str, index: Any, data: bytes, samples: list[int]) -> Any:
    if fmt == "mds":
        from zephon.formats.mds import _vector

        _, encodings, sizes = codec.columns[name]
        decoders, vectors = codec._decoders_for(encodings), [_vector(e) for e in encodings]
    else:
        decoders, vectors = codec._decoders, codec._vectors
        sizes = [None] * len(decoders)
    return records.decode_columns(
        Blob([(0, data)]), index.offsets, samples, sizes, decoders, vectors
    )

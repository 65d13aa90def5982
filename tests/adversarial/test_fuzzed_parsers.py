"""Parsers under random damage: byte flips, truncations and insertions in valid shards of
every format and compression must give valid samples or a FormatError (naming the shard),
never another exception, a hang or a crash."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tests.formatdata import (
    FIXTURES,
    write_compressed_jsonl,
    write_jsonl,
    write_more_compressed_jsonl,
    write_parquet,
    write_webdataset,
)
from zephon import Dataset
from zephon.errors import FormatError

WRITERS: dict[str, Callable[[Path], Any]] = {
    "jsonl": lambda root: write_jsonl(root, shards=1, per_shard=40),
    "jsonl-gz-zst": write_compressed_jsonl,
    "jsonl-bz2-xz": write_more_compressed_jsonl,
    "parquet": lambda root: write_parquet(root, shards=1),
    "webdataset": lambda root: write_webdataset(root, shards=1, per_shard=10),
    "mds": lambda root: shutil.copytree(FIXTURES / "mds", root),
    "litdata": lambda root: shutil.copytree(FIXTURES / "litdata", root),
    "mds-zstd": lambda root: shutil.copytree(FIXTURES / "mds-zstd", root),
    "mds-snappy": lambda root: shutil.copytree(FIXTURES / "mds-snappy", root),
    "litdata-zstd": lambda root: shutil.copytree(FIXTURES / "litdata-zstd", root),
    "litdata-zstd-chunk": lambda root: shutil.copytree(FIXTURES / "litdata-zstd-chunk", root),
    "litdata-zstd-sample": lambda root: shutil.copytree(FIXTURES / "litdata-zstd-sample", root),
    "lance": lambda root: _write_lance(root),
    "vortex": lambda root: _write_vortex(root),
}


def _write_vortex(root: Path) -> None:
    import pyarrow as pa
    import vortex as vx

    root.mkdir(parents=True)
    for f in range(2):
        ids = list(range(f * 30, f * 30 + 30))
        table = pa.table({"id": ids, "text": [f"t{i}" * (i % 5) for i in ids]})
        vx.io.write(vx.array(table), str(root / f"p{f}.vortex"))


def _write_lance(root: Path) -> None:
    import lance
    import pyarrow as pa

    rows = 60
    table = pa.table({"id": list(range(rows)), "text": [f"t{i}" * (i % 5) for i in range(rows)]})
    lance.write_dataset(table, str(root), max_rows_per_file=25)


Damage = tuple[str, float, int]
damages = st.tuples(
    st.sampled_from(["flip", "truncate", "insert"]), st.floats(0, 1), st.integers(1, 255)
)


def damage(data: bytes, how: Damage) -> bytes:
    kind, where, value = how
    if not data:
        return data
    at = min(len(data) - 1, int(where * len(data)))
    if kind == "flip":
        return data[:at] + bytes([data[at] ^ value]) + data[at + 1 :]
    if kind == "truncate":
        return data[:at]
    return data[:at] + bytes([value]) * (1 + value % 7) + data[at:]


def shards(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name != "reference.json")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("fmt", list(WRITERS))
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(hows=st.lists(damages, min_size=1, max_size=3), which=st.integers(0, 99))
# a Vortex field name damaged into a NUL: pyarrow's bare ArrowException once escaped
@example(hows=[("flip", 0.43843355810125695, 1)], which=0)
def test_damaged_shards_give_samples_or_a_format_error(
    tmp_path_factory: pytest.TempPathFactory, fmt: str, hows: list[Damage], which: int
) -> None:
    root = tmp_path_factory.mktemp(fmt) / "data"
    WRITERS[fmt](root)
    files = shards(root)
    target = files[which % len(files)]
    data = target.read_bytes()
    for how in hows:
        data = damage(data, how)
    target.write_bytes(data)
    try:
        fmt_arg = "lance" if fmt == "lance" else None
        ds = Dataset.from_path("fuzz", str(root), index_cache=False, format=fmt_arg)
        samples = ds.head(ds.num_samples)
    except FormatError as exc:
        assert exc.dataset == "fuzz"
        return
    assert len(samples) == ds.num_samples


def test_a_tar_sample_whose_span_cuts_a_member_is_a_format_error(tmp_path: Path) -> None:
    """An index whose span ends inside a member's data (an index edited by hand, or written
    for other bytes): the member was returned cut short, silently."""
    import numpy as np

    from zephon.formats.blob import Blob
    from zephon.formats.index import RecordIndex

    write_webdataset(tmp_path / "w", shards=1, per_shard=3)
    ds = Dataset.from_path("tars", str(tmp_path / "w"), index_cache=False)
    shard, index = ds.shards[0], ds.indexes[0]
    data = Path(shard.uri).read_bytes()
    blob = Blob([(0, data)])
    assert len(ds.codec.decode(shard, index, blob, [0, 1, 2])) == 3
    offsets = np.array(index.offsets, copy=True)
    offsets[1] = offsets[0] + 512 + 3  # three bytes into the first member's data
    with pytest.raises(FormatError, match="ends past its sample") as info:
        ds.codec.decode(shard, RecordIndex(offsets), blob, [0])
    assert (info.value.dataset, info.value.sample) == ("tars", 0)


def _jpegs() -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for options in ({}, {"progressive": True}, {"subsampling": 0}):
        y, x = np.mgrid[0:90, 0:120]
        img = np.stack([x * 2, y * 2, (x + y) % 256], -1) + rng.integers(0, 40, (90, 120, 3))
        buf = io.BytesIO()
        Image.fromarray(img.clip(0, 255).astype(np.uint8)).save(buf, "JPEG", **options)
        out.append(buf.getvalue())
    return out


@pytest.mark.timeout(300)
@settings(max_examples=300, deadline=None)
@given(
    hows=st.lists(damages, min_size=1, max_size=4), which=st.integers(0, 2), seed=st.integers(0, 3)
)
def test_damaged_jpegs_decode_or_give_a_format_error_by_region_and_whole(
    hows: list[Damage], which: int, seed: int
) -> None:
    """zephon._jpeg is C: damaged files (headers included) must come back as pixels or a
    FormatError through both the whole decode and the crop-only decode, never a crash."""
    from zephon.ops.image import RandomResizedCrop
    from zephon.ops.imagedecode import DecodeImage
    from zephon.ops.transform import Chain

    data = _JPEGS[which]
    for how in hows:
        data = damage(data, how)
    crop = RandomResizedCrop(32, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=seed)
    for step in (DecodeImage("jpg"), Chain([("map", DecodeImage("jpg")), ("map", crop)])):
        try:
            out = step({"id": seed, "jpg": data})["jpg"]
        except FormatError:
            continue
        assert out.dtype.name == "uint8" and out.ndim == 3


_JPEGS = _jpegs()

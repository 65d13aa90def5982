"""Decompression bombs: small inputs that declare or cost far more than their size are refused
quickly with a ``FormatError``; real files of the same kinds still read."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import pytest
import zstandard
from PIL import Image

from tests.bombs import jpeg_scan_bomb
from tests.formatdata import FIXTURES
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import FormatError
from zephon.formats import compression
from zephon.ops import jpeg
from zephon.ops.image import RandomResizedCrop
from zephon.ops.imagedecode import DecodeImage
from zephon.ops.jpeg import DecodeCrop

BACKENDS = ["auto", "simplejpeg", "pillow"]


@pytest.fixture(scope="module")
def bomb() -> bytes:
    data = jpeg_scan_bomb(9000, 9000)  # 694 scans, 260 KB: 9-30 s in a decoder
    assert len(data) < 300_000
    return data


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_jpeg_scan_bomb_is_refused_before_decoding(bomb: bytes, backend: str, mode: str) -> None:
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    with pytest.raises(FormatError, match="694 scans, over the 30 allowed"):
        DecodeImage("jpg", mode=mode, backend=backend)({"jpg": bomb})


@pytest.mark.skipif(not jpeg.available(), reason="the region decoder is not built")
def test_the_fused_decode_and_crop_refuses_it_too(bomb: bytes) -> None:
    step = DecodeCrop(
        DecodeImage("jpg"), RandomResizedCrop(64, "jpg", (0.08, 1.0), (0.75, 1.33), 0)
    )
    with pytest.raises(FormatError, match="scan bomb"):
        step({"jpg": bomb, "__key__": "a", "id": 1})


@pytest.mark.parametrize("backend", BACKENDS)
def test_progressive_files_as_encoders_write_them_still_decode(backend: str) -> None:
    if backend == "simplejpeg":
        pytest.importorskip("simplejpeg")
    rng = np.random.default_rng(0)
    picture = rng.integers(0, 255, (300, 400, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(picture).save(buf, "JPEG", progressive=True, quality=90)
    assert buf.getvalue().count(b"\xff\xda") >= 6
    assert DecodeImage("jpg", backend=backend)({"jpg": buf.getvalue()})["jpg"].shape == (
        300,
        400,
        3,
    )
    # Many scans are fine on a small image: 100 allowed below 25 million pixels.
    many = jpeg_scan_bomb(640, 480, bands=9, bits=10)  # 100 scans
    assert DecodeImage("jpg", mode="L", backend=backend)({"jpg": many})["jpg"].shape == (480, 640)


def test_scan_markers_in_metadata_before_the_first_scan_do_not_count() -> None:
    """An ICC profile or an EXIF thumbnail may hold the two bytes of a scan marker."""
    many = jpeg_scan_bomb(640, 480, bands=9, bits=10)  # 100 scans: at the limit
    app = b"\xff\xe2" + (2 + 4000).to_bytes(2, "big") + b"\xff\xda" * 2000
    padded = many[:2] + app + many[2:]
    assert DecodeImage("jpg", mode="L")({"jpg": padded})["jpg"].shape == (480, 640)


def test_with_max_pixels_none_nothing_is_checked() -> None:
    many = jpeg_scan_bomb(640, 480, bands=10, bits=10)  # 111 scans
    with pytest.raises(FormatError, match="111 scans"):
        DecodeImage("jpg", mode="L")({"jpg": many})
    assert DecodeImage("jpg", mode="L", max_pixels=None)({"jpg": many})["jpg"].shape == (480, 640)


# Shards compressed as a whole: a few kilobytes may decompress to terabytes.

STREAMS = {
    "gz": lambda raw: gzip.compress(raw, 1),
    "zst": lambda raw: zstandard.ZstdCompressor(level=1).compress(raw),
    "bz2": lambda raw: bz2.compress(raw, 1),
    "xz": lambda raw: lzma.compress(raw, preset=0),
}


@pytest.mark.parametrize("suffix", list(STREAMS))
def test_streams_decompress_in_bounded_pieces(suffix: str) -> None:
    raw = b'{"text": "' + b"a" * (40 << 20) + b'"}\n'
    kind = compression.stream_kind(f"x.jsonl.{suffix}")
    assert kind is not None
    stream = compression.StreamDecompressor(kind)
    data = STREAMS[suffix](raw) * 2  # two streams one after the other
    sizes = [len(p) for p in stream.pieces(data)]
    stream.finish()
    assert sum(sizes) == 2 * len(raw)
    assert max(sizes) <= max(compression.PIECE_BYTES, 128 << 20)


@pytest.mark.parametrize("suffix", ["zst", "bz2", "xz"])
def test_a_compressed_jsonl_bomb_is_refused_at_discovery_naming_the_shard(
    suffix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(compression, "FLOOR_BYTES", 1 << 20)  # the ratio then decides
    line = b'{"text": "' + b"a" * 4000 + b'"}\n'
    bomb = STREAMS[suffix](line * 16_000)  # 64 MB of lines, several thousand times smaller
    assert len(bomb) * compression.MAX_RATIO < 64_000_000
    (tmp_path / f"bomb.jsonl.{suffix}").write_bytes(bomb)
    with pytest.raises(FormatError, match="decompression bomb") as caught:
        Dataset.from_path("bombs", str(tmp_path), index_cache=False)
    assert f"bomb.jsonl.{suffix}" in str(caught.value) and "'bombs'" in str(caught.value)


def _mds_copy(tmp_path: Path, raw_bytes: int, payload: bytes | None = None) -> Path:
    root = tmp_path / "mds"
    shutil.copytree(FIXTURES / "mds-zstd", root)
    index = json.loads((root / "index.json").read_text())
    shard = index["shards"][0]
    shard["raw_data"]["bytes"] = raw_bytes
    if payload is not None:
        (root / shard["zip_data"]["basename"]).write_bytes(payload)
        shard["zip_data"]["bytes"] = len(payload)
    (root / "index.json").write_text(json.dumps(index))
    return root


def test_an_mds_shard_decompressing_past_its_declared_size_is_a_format_error(
    tmp_path: Path,
) -> None:
    bomb = zstandard.ZstdCompressor(level=1).compress(b"\0" * (512 << 20))  # 16 KB
    root = _mds_copy(tmp_path, raw_bytes=4023, payload=bomb)
    ds = Dataset.from_path("m", str(root), index_cache=False)
    with pytest.raises(FormatError, match="past 4,023 bytes") as caught:
        list(Pipeline(StaticMixtureWorkSource([ds], seed=1), rank=0, world_size=1))
    assert "shard.00000.mds.zstd" in str(caught.value)


def test_an_mds_index_declaring_too_few_raw_bytes_is_a_format_error(tmp_path: Path) -> None:
    ds = Dataset.from_path("m", str(_mds_copy(tmp_path, raw_bytes=100)), index_cache=False)
    with pytest.raises(FormatError, match="past 100 bytes"):
        list(Pipeline(StaticMixtureWorkSource([ds], seed=1), rank=0, world_size=1))


def _png(width: int, height: int, idat: bytes) -> bytes:
    import struct
    import zlib

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)  # 8-bit grey
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")
    )


def test_a_png_declaring_a_huge_image_is_refused_before_inflating() -> None:
    """A few kilobytes declaring 10,000 x 10,000 pixels (Pillow refuses past twice that)."""
    import zlib

    idat = zlib.compress(b"\0" * (1 << 20), 9)  # the start of the rows: a tiny file
    bomb = _png(10_000, 10_000, idat)
    assert len(bomb) < 5_000
    with pytest.raises(FormatError, match="over max_pixels"):
        DecodeImage("img")({"img": bomb})


def test_a_png_whose_data_inflates_past_its_size_gives_the_declared_image_or_an_error() -> None:
    """The rows Pillow inflates are bounded by the header's size, whatever the zlib stream
    holds beyond them."""
    import zlib

    rows = b"".join(b"\0" + bytes([i % 256]) * 64 for i in range(64))
    bomb = _png(64, 64, zlib.compress(rows + b"\0" * (64 << 20), 9))  # 64 MB more than needed
    try:
        image = DecodeImage("img", mode="L")({"img": bomb})["img"]
    except FormatError:
        return
    assert image.shape == (64, 64)

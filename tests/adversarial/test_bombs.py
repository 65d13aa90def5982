"""Decompression bombs: small inputs that declare or cost far more than their size are refused
quickly with a ``FormatError``; real files of the same kinds still read."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from tests.bombs import jpeg_scan_bomb
from zephon.errors import FormatError
from zephon.ops import jpeg
from zephon.ops.image import DecodeImage, RandomResizedCrop
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
    step = DecodeCrop(DecodeImage("jpg"), RandomResizedCrop(64, "jpg", (0.08, 1.0), (0.75, 1.33), 0))
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
    assert DecodeImage("jpg", backend=backend)({"jpg": buf.getvalue()})["jpg"].shape == (300, 400, 3)
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

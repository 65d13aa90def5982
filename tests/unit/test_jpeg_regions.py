"""Region decoding of JPEG (zephon._jpeg): a region has exactly the pixels of the whole image
decoded and cut, for every chroma subsampling, progressive files, grey files and draft
scales; decode_image -> random_resized_crop on workers decodes only the crop and gives the
pixels of the two steps run one after the other; damage is a FormatError."""

from __future__ import annotations

import io
import random

import numpy as np
import pytest

from zephon.errors import FormatError
from zephon.ops import jpeg
from zephon.ops.image import RandomResizedCrop
from zephon.ops.imagedecode import DecodeImage
from zephon.ops.transform import Chain

Image = pytest.importorskip("PIL.Image")
pytestmark = pytest.mark.skipif(not jpeg.available(), reason="built without libjpeg-turbo")


def photo(seed: int, height: int, width: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // width, y * 255 // height, (x * y) % 256], axis=-1)
    return (base + rng.integers(0, 40, (height, width, 3))).clip(0, 255).astype(np.uint8)


def encode(img: np.ndarray, mode: str = "RGB", **options: object) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img).convert(mode).save(buf, format="JPEG", quality=85, **options)
    return buf.getvalue()


FILES = {  # Pillow's subsampling: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0
    "4:2:0": {"subsampling": 2},
    "4:2:2": {"subsampling": 1},
    "4:4:4": {"subsampling": 0},
    "progressive": {"progressive": True},
}


def whole(data: bytes, gray: bool, scale: int) -> np.ndarray:
    h, w, _ = jpeg.header(data)
    return jpeg.decode_region(data, gray, scale, (0, 0, -(-h // scale), -(-w // scale)))


@pytest.mark.parametrize("kind", [*FILES, "grey file"])
def test_a_region_has_the_pixels_of_the_whole_image_cut(kind: str) -> None:
    rng = random.Random(kind)
    for i in range(6):
        img = photo(i, rng.randrange(60, 300), rng.randrange(60, 300))
        data = encode(img, "L") if kind == "grey file" else encode(img, **FILES[kind])  # type: ignore[arg-type]
        for gray in (False, True):
            for scale in (1, 2, 4, 8):
                full = whole(data, gray, scale)
                h, w = full.shape[:2]
                for _ in range(25):
                    ch, cw = rng.randrange(1, h + 1), rng.randrange(1, w + 1)
                    top, left = rng.randrange(h - ch + 1), rng.randrange(w - cw + 1)
                    got = jpeg.decode_region(data, gray, scale, (top, left, ch, cw))
                    assert np.array_equal(got, full[top : top + ch, left : left + cw]), (
                        kind,
                        i,
                        gray,
                        scale,
                        (top, left, ch, cw),
                    )


def test_whole_images_match_simplejpeg() -> None:
    simplejpeg = pytest.importorskip("simplejpeg")
    for i, options in enumerate(FILES.values()):
        data = encode(photo(i, 200, 150), **options)  # type: ignore[arg-type]
        want = simplejpeg.decode_jpeg(data, fastdct=False, fastupsample=False)
        assert np.array_equal(whole(data, False, 1), want)


@pytest.mark.parametrize("max_size", [None, 64])
@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_a_decode_then_a_crop_on_workers_decodes_the_crop_with_the_same_pixels(
    mode: str, max_size: int | None
) -> None:
    decode = DecodeImage("jpg", mode=mode, max_size=max_size)
    crop = RandomResizedCrop(48, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=4)
    chain = Chain([("map", decode), ("map", crop)])
    assert [type(fn).__name__ for _, fn in chain._calls] == ["DecodeCrop"]
    rng = random.Random(1)
    for i in range(40):
        data = encode(
            photo(i, rng.randrange(60, 400), rng.randrange(60, 400)),
            **FILES[rng.choice(list(FILES))],
        )  # type: ignore[arg-type]
        for sample in ({"__key__": f"k{i}", "jpg": data}, {"id": i, "jpg": {"bytes": data}}):
            assert np.array_equal(chain(sample)["jpg"], crop(decode(sample))["jpg"])


def test_what_cannot_be_decoded_by_region_runs_as_two_steps() -> None:
    decode = DecodeImage("jpg")
    crop = RandomResizedCrop(32, "jpg", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
    chain = Chain([("map", decode), ("map", crop)])
    img = photo(3, 90, 120)
    cmyk = io.BytesIO()
    Image.fromarray(img).convert("CMYK").save(cmyk, format="JPEG")
    png = io.BytesIO()
    Image.fromarray(img).save(png, format="PNG")
    samples = [
        {"jpg": encode(img)},  # no identity: the draw is keyed by the pixels
        {"id": 1, "jpg": cmyk.getvalue()},
        {"id": 2, "jpg": png.getvalue()},
    ]
    for sample in samples:
        assert np.array_equal(chain(sample)["jpg"], crop(decode(sample))["jpg"])
    other = RandomResizedCrop(32, "other", (0.08, 1.0), (3 / 4, 4 / 3), seed=0)
    assert decode.fused_with(other) is None  # a crop of another field
    assert DecodeImage("jpg", backend="pillow").fused_with(crop) is None


def test_damage_in_the_rows_read_is_a_format_error_naming_the_field() -> None:
    data = encode(photo(5, 200, 200))
    most = RandomResizedCrop(32, "jpg", (0.9, 1.0), (1.0, 1.0), seed=0)  # reads nearly all
    chain = Chain([("map", DecodeImage("jpg")), ("map", most)])
    for broken in (data[: len(data) // 2], data[:400] + bytes(len(data) - 400)):
        with pytest.raises(FormatError, match="corrupt image in field 'jpg'"):
            chain({"id": 0, "jpg": broken})
        with pytest.raises(FormatError, match="corrupt image in field 'jpg'"):
            DecodeImage("jpg")({"jpg": broken})
    with pytest.raises(FormatError, match="max_pixels"):
        Chain(
            [
                ("map", DecodeImage("jpg", max_pixels=100)),
                ("map", RandomResizedCrop(8, "jpg", (0.5, 1.0), (1.0, 1.0), seed=0)),
            ]
        )({"id": 0, "jpg": data})


@pytest.mark.parametrize(
    "box", [(2**32 - 1, 0, 2, 4), (0, 2**32 - 1, 2, 4), (30, 0, 2, 4), (0, 0, 2, 41)]
)
def test_a_region_outside_the_image_is_refused_whatever_its_numbers(
    box: tuple[int, int, int, int],
) -> None:
    """Checked without sums: ``top + height`` at 2**32 - 1 + 2 once wrapped to 1 and passed."""
    data = encode(photo(3, 30, 40))
    with pytest.raises(ValueError, match="region outside"):
        jpeg.decode_region(data, False, 1, box)

"""JPEG through Zephon's own binding of libjpeg-turbo (``zephon._jpeg``, built at install
when libjpeg-turbo's headers are there), which decodes a region of an image without
decoding the rest: the rows above it are skipped, decoding stops at its last row, and the
columns beside it skip the inverse DCT and colour conversion.

``decode_image`` followed by ``random_resized_crop`` of the same field on the same workers
runs as one :class:`DecodeCrop`: the crop is drawn from the image's size in its header, then
only that region is decoded (about 0.6 of a whole decode's time for ImageNet's crop
distribution, ``benchmarks/images.py``). Its pixels are those of the two steps run one after
the other (``tests/unit/test_jpeg_regions.py``): decoding, the draw and the resize are the
same; only the work on pixels that the crop drops is left out. A region decode reads the
file down to the crop's last row, so damage below it goes unseen.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from zephon.ops.image import RandomResizedCrop
    from zephon.ops.imagedecode import DecodeImage

__all__ = ["DecodeCrop", "available", "decode_region", "draft_scale", "header"]

_JPEG = b"\xff\xd8\xff"


def _binding() -> ModuleType | None:
    try:
        return importlib.import_module("zephon._jpeg")
    except ImportError:  # built without libjpeg-turbo's headers
        return None


_BINDING = _binding()


def available() -> bool:
    """Whether region decoding was built (``zephon._jpeg``)."""
    return _BINDING is not None


def header(data: bytes) -> tuple[int, int, int]:
    """``(height, width, channels)`` from a JPEG's header (no pixels decoded); ValueError
    for a damaged header."""
    assert _BINDING is not None
    height, width, channels = _BINDING.output_size(data, 1)
    return int(height), int(width), int(channels)


def decode_region(
    data: bytes, gray: bool, scale: int, box: tuple[int, int, int, int]
) -> np.ndarray:
    """The ``(top, left, height, width)`` region of the image decoded at ``1/scale``, as a
    uint8 ``HxWx3`` (``HxW`` if ``gray``) array. ValueError for damaged data in the rows
    read; NotImplementedError for CMYK files."""
    assert _BINDING is not None
    top, left, height, width = box
    out = np.empty((height, width) if gray else (height, width, 3), np.uint8)
    _BINDING.decode(data, out, gray, scale, top, left, height, width)
    return out


def draft_scale(height: int, width: int, max_size: int | None) -> int:
    """The smallest of 1/2, 1/4 and 1/8 scale that keeps both sides >= ``max_size`` (as its
    denominator; 1: full size). Only those three: libjpeg-turbo has SIMD code for them,
    while its other M/8 scales (7/8, 3/4...) run plain C and decode a 400 px image slower at
    7/8 than at full size (1,035 against 1,289 images/s, benchmarks/images.py)."""
    scale = 1
    while (
        max_size
        and scale < 8
        and min(-(-height // (2 * scale)), -(-width // (2 * scale))) >= max_size
    ):
        scale *= 2
    return scale


def is_jpeg(value: Any) -> bool:
    return isinstance(value, bytes | bytearray | memoryview) and bytes(value[:3]) == _JPEG


class DecodeCrop:
    """``decode`` (a :class:`~zephon.ops.imagedecode.DecodeImage`) then ``crop`` (a
    :class:`~zephon.ops.image.RandomResizedCrop` of the field it writes) in one call that
    decodes only the crop of a JPEG. Anything else (no binding, PNG, a sample without an
    identity to key the draw by, CMYK) runs the two steps as they are."""

    releases_gil = True  # as the two steps

    def __init__(self, decode: DecodeImage, crop: RandomResizedCrop) -> None:
        self.decode, self.crop = decode, crop
        self.__name__ = f"{decode.__name__} -> {crop.__name__}"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        from zephon.ops.imagedecode import jpeg_region

        value = sample.get(self.decode.field)
        if isinstance(value, dict) and "bytes" in value:
            value = value["bytes"]
        if not (_BINDING is not None and is_jpeg(value) and self.crop.keyed(sample)):
            return self.crop(self.decode(sample))
        d, data = self.decode, bytes(value)  # type: ignore[arg-type]  # is_jpeg: bytes-like
        image = d.guarded(
            jpeg_region,
            data,
            d.mode,
            d.max_size,
            d.max_pixels,
            lambda h, w: self.crop.box(sample, h, w),
        )
        if image is None:  # CMYK: the decoders that convert it
            return self.crop(d(sample))
        return {**sample, d.out: self.crop.resized(image)}

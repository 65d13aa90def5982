"""Image decoding: encoded bytes (or an HF ``{"bytes", "path"}`` value, or base64 text) to a
uint8 ``HxWxC`` array (``HxW`` for ``mode="L"``), bounded by what the header may declare
(:mod:`zephon.ops.imagelimits`).

Decoding: JPEG through libjpeg-turbo (Zephon's own binding, :mod:`zephon.ops.jpeg`, when it
was built, else ``simplejpeg``), with DCT scaling when a ``max_size`` says how small the
image may be (draft mode: decoding at 1/2, 1/4 or 1/8 scale, the three libjpeg-turbo has fast
code for); everything else (PNG, WebP, GIF...) and JPEG without either through Pillow. A
decode followed by a random resized crop on the same workers decodes only the crop
(:class:`~zephon.ops.jpeg.DecodeCrop`), with the same pixels.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from zephon.choices import ImageBackend, ImageMode, choices
from zephon.errors import ConfigError, FormatError
from zephon.ops import jpeg
from zephon.ops.image import RandomResizedCrop, _Step
from zephon.ops.imagelimits import MAX_PIXELS, check_pixels, check_scans

__all__ = ["DecodeImage", "jpeg_region"]

_JPEG = b"\xff\xd8\xff"
T = TypeVar("T")
# imported lazily; a worker pool preloads them
WORKER_IMPORTS = ("simplejpeg", "PIL.Image")


def _image_bytes(value: Any, field: str) -> bytes:
    """Bytes of an encoded image: raw bytes, the HF ``{"bytes", "path"}`` layout, or base64."""
    if isinstance(value, dict) and "bytes" in value:
        value = value["bytes"]
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise FormatError(f"field {field!r} is a string but not base64") from None
    raise FormatError(f"field {field!r} holds {type(value).__name__}, not image bytes")


def _decode(
    data: bytes, mode: str, backend: str, max_size: int | None, max_pixels: int | None
) -> np.ndarray:
    if data[:3] == _JPEG and backend == "auto" and mode in ("RGB", "L") and jpeg.available():
        whole = jpeg_region(data, mode, max_size, max_pixels)
        if whole is not None:
            return whole
        backend = "pillow"  # CMYK: Pillow converts it
    if data[:3] == _JPEG and backend in ("auto", "simplejpeg") and mode in ("RGB", "L"):
        try:
            import simplejpeg
        except ImportError:
            if backend == "simplejpeg":
                raise ConfigError("backend='simplejpeg' needs: pip install simplejpeg") from None
        else:
            height, width, _, _ = simplejpeg.decode_jpeg_header(data)
            check_pixels(width, height, max_pixels)
            check_scans(data, width, height, max_pixels)
            kw = _draft(height, width, max_size) if max_size else {}
            colorspace = "RGB" if mode == "RGB" else "GRAY"
            out: np.ndarray = simplejpeg.decode_jpeg(
                data, colorspace=colorspace, fastdct=False, fastupsample=False, **kw
            )
            return out[:, :, 0] if mode == "L" else out
    try:
        from PIL import Image
    except ImportError:
        raise ConfigError("decoding this image needs Pillow: pip install zephon[images]") from None
    with warnings.catch_warnings():  # Pillow's size warning: max_pixels says it (or not)
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        img = Image.open(io.BytesIO(data))
    with img:
        check_pixels(*img.size, max_pixels)
        if img.format == "JPEG":
            check_scans(data, *img.size, max_pixels)
        if max_size and img.format == "JPEG":
            img.draft(mode, (max_size, max_size))  # DCT scaling, never below max_size
        return np.asarray(img.convert(mode))


def jpeg_region(
    data: bytes,
    mode: str,
    max_size: int | None,
    max_pixels: int | None,
    choose: Callable[[int, int], tuple[int, int, int, int]] | None = None,
) -> np.ndarray | None:
    """A JPEG through :mod:`zephon.ops.jpeg`: whole, or the ``(top, left, height, width)``
    region ``choose(height, width)`` picks in the image as decoded (at the draft scale
    ``max_size`` allows); ``None`` for a CMYK file, which it cannot convert."""
    height, width, _ = jpeg.header(data)
    check_pixels(width, height, max_pixels)
    check_scans(data, width, height, max_pixels)
    scale = jpeg.draft_scale(height, width, max_size)
    h, w = -(-height // scale), -(-width // scale)
    try:
        box = choose(h, w) if choose else (0, 0, h, w)
        return jpeg.decode_region(data, mode == "L", scale, box)
    except NotImplementedError:
        return None


def _draft(height: int, width: int, max_size: int) -> dict[str, int]:
    """simplejpeg's size bounds for :func:`~zephon.ops.jpeg.draft_scale`."""
    scale = jpeg.draft_scale(height, width, max_size)
    return {"min_height": -(-height // scale), "min_width": -(-width // scale)}


def _to_mode(image: np.ndarray, mode: str) -> np.ndarray:
    """A decoded uint8 image (``HxW``, ``HxWx2`` with alpha, ``HxWx3``, ``HxWx4``) in ``mode``."""
    gray = image if image.ndim == 2 else (image[..., 0] if image.shape[2] <= 2 else None)
    if mode == "L":
        if gray is not None:
            return gray
        rgb = image[..., :3].astype(np.float32)  # ITU-R 601-2 luma, as Pillow converts
        return (rgb @ np.array([0.299, 0.587, 0.114], np.float32) + 0.5).astype(np.uint8)
    rgb = np.repeat(gray[..., None], 3, axis=2) if gray is not None else image[..., :3]
    if mode == "RGB":
        return np.ascontiguousarray(rgb)
    has_alpha = image.ndim == 3 and image.shape[2] in (2, 4)
    alpha = image[..., -1:] if has_alpha else np.full((*rgb.shape[:2], 1), 255, np.uint8)
    return np.concatenate([rgb, alpha], axis=2)


class DecodeImage(_Step):
    """``sample[field]`` (encoded bytes) -> a uint8 array in ``sample[out or field]``."""

    def __init__(
        self,
        field: str,
        mode: ImageMode = "RGB",
        backend: ImageBackend = "auto",
        max_size: int | None = None,
        out: str | None = None,
        max_pixels: int | None = MAX_PIXELS,
    ) -> None:
        if backend not in choices(ImageBackend):
            raise ConfigError(f"backend must be 'auto', 'simplejpeg' or 'pillow', got {backend!r}")
        if mode not in choices(ImageMode):
            raise ConfigError(f"mode must be 'RGB', 'L' or 'RGBA', got {mode!r}")
        self.field, self.mode, self.backend, self.max_size = field, mode, backend, max_size
        self.max_pixels = max_pixels
        self.out = out or field
        limit = "" if max_pixels == MAX_PIXELS else f", max_pixels={max_pixels}"
        self.__name__ = (
            f"decode_image(field={field!r}, mode={mode!r}, "
            f"max_size={max_size}, out={self.out!r}{limit})"
        )

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        if self.field not in sample:
            raise FormatError(f"no field {self.field!r} in the sample (fields: {sorted(sample)})")
        value = sample[self.field]
        if isinstance(value, np.ndarray):  # raw pixels already (MDS / LitData "pil")
            return {**sample, self.out: _to_mode(value, self.mode)}
        data = _image_bytes(value, self.field)
        args = (data, self.mode, self.backend, self.max_size, self.max_pixels)
        return {**sample, self.out: self.guarded(_decode, *args)}

    def guarded(self, decode: Callable[..., T], *args: Any) -> T:
        """``decode(*args)``, its errors for bad input as ``FormatError`` naming the field."""
        try:
            return decode(*args)
        except ConfigError:
            raise
        except FormatError as exc:
            raise FormatError(f"field {self.field!r}: {exc}") from None
        except Exception as exc:  # each decoder has its own errors for a corrupt image
            # Pillow names its in-memory file ("<_io.BytesIO object at 0x...>"): noise.
            why = re.sub(r" ?<_io\.BytesIO object at 0x[0-9a-f]+>", "", str(exc))
            raise FormatError(
                f"corrupt image in field {self.field!r} ({type(exc).__name__}: {why})"
            ) from None

    def fused_with(self, after: Any) -> Any:
        """This decode and ``after`` as one call when ``after`` is a random resized crop of
        the image it writes (only the crop of a JPEG is decoded), else ``None``."""
        if (
            isinstance(after, RandomResizedCrop)
            and after.field == self.out
            and self.backend == "auto"
            and self.mode in ("RGB", "L")
            and jpeg.available()
        ):
            return jpeg.DecodeCrop(self, after)
        return None

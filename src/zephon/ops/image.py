"""Image steps: resize, crop, flip and channel order of decoded images, one sample at a time
(decoding is :mod:`zephon.ops.imagedecode`).

Each step is a picklable callable object (run by ``map``), so ``processes=N`` and
``executor=`` run it in workers with output identical to in-process. Randomness is keyed by
the sample (its ``__key__``, ``id`` or ``_provenance``, else its image bytes), the pass it was
drawn in (:func:`zephon.sample_pass`) and a seed, never by a shared generator: the same sample
gets the same crop and flip in any process, at any worker count and after a restore, and
another in each pass.

Images come out as uint8 ``HxWxC`` numpy arrays (``HxW`` for ``mode="L"``). Resizing goes
through OpenCV when installed (bilinear, area averaging when shrinking 2x or more: 4x
faster than Pillow on a crop, which copies the pixels into and out of its own layout), else
Pillow (bilinear); ``backend=`` picks one. Their pixels differ slightly, so a restore is
exact with the same backend.
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any, TypeVar

import numpy as np

from zephon.choices import ResizeBackend, choices
from zephon.context import sample_pass
from zephon.errors import ConfigError

__all__ = ["CenterCrop", "Flip", "RandomResizedCrop", "Resize", "ToCHW"]

T = TypeVar("T")
# imported lazily; a worker pool preloads them
WORKER_IMPORTS = ("PIL.Image", "cv2")
RESIZERS: tuple[str, ...] = choices(ResizeBackend)


class _Step:
    """An image step: stateless, its work in C without the GIL (threads may run it)."""

    releases_gil = True


def _key(sample: dict[str, Any]) -> Any:
    return sample.get("__key__", sample.get("id", sample.get("_provenance")))


def _rng(sample: dict[str, Any], image: Any, seed: int, salt: str) -> np.random.Generator:
    """A generator keyed by the sample's identity, the pass it was drawn in, the seed and
    the step (pass 0 adds nothing to the key: the first pass draws as an op called alone)."""
    h = hashlib.blake2b(f"{seed}\0{salt}\0".encode(), digest_size=16)
    pass_ = sample_pass()
    if pass_:
        h.update(f"pass {pass_}\0".encode())
    key = _key(sample)
    if key is not None:
        h.update(repr(key).encode())
    else:  # no identity: the image itself
        h.update(repr(image.shape).encode())
        h.update(np.ascontiguousarray(image).data)
    return np.random.default_rng(int.from_bytes(h.digest(), "little"))


def _opencv(backend: str) -> Any:
    """The ``cv2`` module if ``backend`` allows it and it is installed, else ``None``."""
    if backend == "pillow":
        return None
    cv2 = _cv2()
    if cv2 is None and backend == "opencv":
        raise ConfigError("backend='opencv' needs: pip install opencv-python-headless")
    return cv2


@functools.cache
def _cv2() -> Any:
    try:
        import cv2
    except ImportError:
        return None
    return cv2


def _resize(image: np.ndarray, height: int, width: int, backend: str = "auto") -> np.ndarray:
    """``image`` at ``(height, width)``: bilinear, or area averaging when OpenCV shrinks it
    2x or more (bilinear would alias). Always a contiguous array of its own size (a crop
    of the right size is a view of the whole image)."""
    if image.shape[:2] == (height, width):
        return np.ascontiguousarray(image)
    cv2 = _opencv(backend)
    if (
        cv2 is not None
        and image.dtype == np.uint8
        and (image.ndim == 2 or image.shape[2] in (3, 4))
    ):
        h, w = image.shape[:2]
        shrink = h >= 2 * height or w >= 2 * width
        resized: np.ndarray = cv2.resize(
            image, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
        )
        return resized
    from PIL import Image

    image = np.ascontiguousarray(image)
    return np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BILINEAR))


def _resizer(backend: str) -> str:
    if backend not in RESIZERS:
        raise ConfigError(f"backend must be one of {RESIZERS}, got {backend!r}")
    return backend


def _named(backend: str) -> str:
    """The backend in a step's name, unless it is the default (names are in checkpoints)."""
    return "" if backend == "auto" else f", backend={backend!r}"


def _pair(size: int | tuple[int, int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class Resize(_Step):
    """To ``size`` (``(height, width)``), or with the shorter side at ``size`` (an int)."""

    def __init__(
        self, size: int | tuple[int, int], field: str, backend: ResizeBackend = "auto"
    ) -> None:
        self.size, self.field, self.backend = size, field, _resizer(backend)
        self.__name__ = f"resize({size!r}, field={field!r}{_named(backend)})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        if isinstance(self.size, int):
            h, w = image.shape[:2]
            scale = self.size / min(h, w)
            height, width = max(1, round(h * scale)), max(1, round(w * scale))
        else:
            height, width = _pair(self.size)
        return {**sample, self.field: _resize(image, height, width, self.backend)}


class CenterCrop(_Step):
    """The central ``size`` (``(height, width)`` or a square), padded with zeros if larger."""

    def __init__(self, size: int | tuple[int, int], field: str) -> None:
        self.size, self.field = _pair(size), field
        self.__name__ = f"center_crop({size!r}, field={field!r})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        height, width = self.size
        h, w = image.shape[:2]
        if h < height or w < width:
            pad = [(0, max(0, height - h)), (0, max(0, width - w))] + [(0, 0)] * (image.ndim - 2)
            image = np.pad(image, pad)
            h, w = image.shape[:2]
        top, left = (h - height) // 2, (w - width) // 2
        return {
            **sample,
            self.field: np.ascontiguousarray(image[top : top + height, left : left + width]),
        }


class RandomResizedCrop(_Step):
    """A crop of random area (``scale`` of the image) and aspect ratio (``ratio``), resized to
    ``size``; the draw is keyed by the sample and ``seed`` (module docstring). After ten
    draws that do not fit, the central crop of the nearest ratio, as torchvision does."""

    def __init__(
        self,
        size: int | tuple[int, int],
        field: str,
        scale: tuple[float, float],
        ratio: tuple[float, float],
        seed: int,
        backend: ResizeBackend = "auto",
    ) -> None:
        self.size, self.field, self.seed = _pair(size), field, seed
        self.scale, self.ratio, self.backend = scale, ratio, _resizer(backend)
        self.__name__ = (
            f"random_resized_crop({size!r}, field={field!r}, scale={scale}, "
            f"ratio={ratio}, seed={seed}{_named(backend)})"
        )

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        h, w = image.shape[:2]
        top, left, ch, cw = self.box(sample, h, w, image)
        return {**sample, self.field: self.resized(image[top : top + ch, left : left + cw])}

    def keyed(self, sample: dict[str, Any]) -> bool:
        """Whether the draw for ``sample`` is keyed by its identity (else by its pixels)."""
        return _key(sample) is not None

    def resized(self, crop: np.ndarray) -> np.ndarray:
        return _resize(crop, *self.size, self.backend)

    def box(
        self, sample: dict[str, Any], h: int, w: int, image: np.ndarray | None = None
    ) -> tuple[int, int, int, int]:
        """The crop ``(top, left, height, width)`` drawn for ``sample`` in an ``h`` x ``w``
        image (``image`` keys the draw when the sample has no identity)."""
        rng = _rng(sample, image, self.seed, "random_resized_crop")
        area = h * w
        log_ratio = np.log(self.ratio)
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = float(np.exp(rng.uniform(*log_ratio)))
            cw, ch = round(np.sqrt(target * aspect)), round(np.sqrt(target / aspect))
            if 0 < cw <= w and 0 < ch <= h:
                top, left = int(rng.integers(0, h - ch + 1)), int(rng.integers(0, w - cw + 1))
                break
        else:
            aspect = min(max(w / h, self.ratio[0]), self.ratio[1])
            cw, ch = (w, round(w / aspect)) if w / h < aspect else (round(h * aspect), h)
            cw, ch = min(cw, w), min(ch, h)
            top, left = (h - ch) // 2, (w - cw) // 2
        return top, left, ch, cw


class Flip(_Step):
    """A horizontal flip with probability ``p`` (keyed by the sample and ``seed``)."""

    def __init__(self, field: str, p: float, seed: int) -> None:
        self.field, self.p, self.seed = field, p, seed
        self.__name__ = f"flip(field={field!r}, p={p}, seed={seed})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        if _rng(sample, image, self.seed, "flip").random() >= self.p:
            return sample
        return {**sample, self.field: _flipped(image)}


def _flipped(image: np.ndarray) -> np.ndarray:
    """``image[:, ::-1]``, contiguous: by OpenCV when installed (224 x 224 x 3 in 30 us),
    else with a pixel's channels moved as one item (numpy copies a reversed axis item by
    item: 220 us, as pixels 100 us)."""
    cv2 = _cv2()
    if cv2 is not None and image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] in (3, 4):
        flipped: np.ndarray = cv2.flip(image, 1)
        return flipped
    if image.ndim != 3 or not image.flags.c_contiguous:
        return np.ascontiguousarray(image[:, ::-1])
    pixel = np.dtype((np.void, image.shape[2] * image.itemsize))
    return np.ascontiguousarray(image.view(pixel)[:, ::-1]).view(image.dtype).reshape(image.shape)


class ToCHW(_Step):
    """``HxWxC`` -> ``CxHxW`` (contiguous), so ``batch()`` stacks ``NCHW``."""

    def __init__(self, field: str) -> None:
        self.field = field
        self.__name__ = f"to_chw(field={field!r})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        if image.ndim == 2:
            return {**sample, self.field: image[None]}
        return {**sample, self.field: channels_first(image)}


def channels_first(image: np.ndarray) -> np.ndarray:
    """``HxWxC`` -> contiguous ``CxHxW``: OpenCV's channel split when installed (224 x 224 x
    3 uint8 in 22 us, against numpy's strided copy of the transpose in 42 us)."""
    cv2 = _cv2()
    if cv2 is not None and image.dtype == np.uint8 and 1 < image.shape[2] <= 4:
        out = np.empty((image.shape[2], *image.shape[:2]), np.uint8)
        for c, plane in enumerate(cv2.split(image)):
            out[c] = plane
        return out
    return np.ascontiguousarray(image.transpose(2, 0, 1))

"""to_tensor: a decoded image as a model takes it (layout, dtype, normalisation).

A picklable step run by ``map`` like the steps of :mod:`zephon.ops.image`, so it runs with
them in the same worker call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon.choices import TensorDtype, TensorLayout, choices
from zephon.errors import ConfigError
from zephon.ops.image import channels_first

__all__ = ["ToTensor"]

_LAYOUTS = {"CHW": "CHW", "NCHW": "CHW", "HWC": "HWC", "NHWC": "HWC"}
_DTYPES: tuple[str, ...] = choices(TensorDtype)


class ToTensor:
    """An image as a model takes it: ``layout`` ``"CHW"`` (``batch()`` then stacks
    ``NCHW``) or ``"HWC"``; ``dtype`` ``"uint8"`` as decoded, or a float type scaled to
    ``[0, 1]`` and, with ``mean`` and ``std`` (per channel, or one for all, on that scale),
    normalised: ``(x / 255 - mean) / std``, as one multiply-add over the array. A gray
    ``HxW`` image gets one channel."""

    def __init__(
        self,
        field: str,
        layout: TensorLayout = "CHW",
        dtype: TensorDtype = "uint8",
        mean: Any = None,
        std: Any = None,
    ) -> None:
        if str(layout).upper() not in _LAYOUTS:
            raise ConfigError(f"layout must be one of {sorted(_LAYOUTS)}, got {layout!r}")
        upper, name = str(layout).upper(), _dtype_name(dtype)  # numpy dtypes are accepted too
        if name not in _DTYPES:
            raise ConfigError(f"dtype must be one of {_DTYPES}, got {dtype!r}")
        if (mean is None) != (std is None):
            raise ConfigError("to_tensor needs both mean and std, or neither")
        if mean is not None and name == "uint8":
            raise ConfigError("normalising (mean, std) needs dtype='float32' or 'float16'")
        self.field, self.layout, self.dtype = field, _LAYOUTS[upper], name
        self.mean = None if mean is None else np.atleast_1d(np.asarray(mean, np.float32))
        self.std = None if std is None else np.atleast_1d(np.asarray(std, np.float32))
        if self.std is not None and not (self.std > 0).all():
            raise ConfigError(f"std must be > 0, got {std!r}")
        norm = "" if mean is None else f", mean={_floats(mean)}, std={_floats(std)}"
        self.__name__ = f"to_tensor(field={field!r}, layout={self.layout!r}, dtype={name!r}{norm})"

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        image = sample[self.field]
        if not isinstance(image, np.ndarray) or image.ndim not in (2, 3):
            raise ConfigError(
                f"to_tensor needs a decoded HxW or HxWxC image in "
                f"{self.field!r} (decode_image first)"
            )
        if image.ndim == 2:
            image = image[:, :, None]
        channels = image.shape[2]
        # uint8 moves to CHW (a quarter of float32's bytes), then scales along its channels
        out: np.ndarray = channels_first(image) if self.layout == "CHW" else image
        if self.dtype != "uint8":
            scale: np.ndarray = np.full(1, 1 / 255, np.float32)
            offset: np.ndarray = np.zeros(1, np.float32)
            if self.mean is not None and self.std is not None:
                if len(self.mean) not in (1, channels) or len(self.std) not in (1, channels):
                    raise ConfigError(
                        f"mean and std have {len(self.mean)} and {len(self.std)} "
                        f"values for an image of {channels} channels"
                    )
                scale, offset = scale / self.std, -self.mean / self.std
            if self.layout == "CHW":
                scale, offset = scale.reshape(-1, 1, 1), offset.reshape(-1, 1, 1)
            out = (out * scale + offset).astype(self.dtype, copy=False)
        return {**sample, self.field: np.ascontiguousarray(out)}


def _dtype_name(dtype: Any) -> str:
    """``"float32"`` for ``"float32"``, ``np.float32`` or ``torch.float32`` alike."""
    try:
        return np.dtype(str(dtype).removeprefix("torch.") if "torch" in str(dtype) else dtype).name
    except TypeError:
        return str(dtype)


def _floats(values: Any) -> list[float]:
    return [float(x) for x in np.atleast_1d(np.asarray(values, np.float64))]

"""The choice arguments of the public API, as types: each is a ``Literal`` of what is
allowed, so a type checker and the API reference show the choices. Callers without a type
checker can pass any value, so every choice is also checked at run time (:func:`check`),
against the same ``Literal``.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from zephon.errors import ConfigError

__all__ = [
    "DatasetFormat",
    "Engine",
    "ExhaustedPolicy",
    "ImageBackend",
    "ImageMode",
    "LossOn",
    "MixtureUnit",
    "OnError",
    "OnSurplus",
    "PackAlgorithm",
    "Padding",
    "PositionIds",
    "ResizeBackend",
    "ShuffleMode",
    "SpecialTokens",
    "TensorDtype",
    "TensorLayout",
    "WeightBy",
    "check",
    "choices",
]

ShuffleMode = Literal["none", "shards", "block", "global"]
ExhaustedPolicy = Literal["repeat", "stop", "drop"]
MixtureUnit = Literal["samples", "tokens"]
DatasetFormat = Literal["jsonl", "parquet", "mds", "webdataset", "litdata", "vortex", "lance"]
Engine = Literal["thread", "process"]
OnError = Literal["raise", "skip"]
WeightBy = Literal["samples", "tokens"]
OnSurplus = Literal["emit", "drop"]
PackAlgorithm = Literal["concat", "first_fit", "best_fit", "best_fit_wrap"]
PositionIds = Literal["row", "document"]
SpecialTokens = Literal["bos_eos", "bos", "eos", "none"]
Padding = Literal[False, True, "max_length"]
LossOn = Literal["assistant", "last", "all"]
ImageMode = Literal["RGB", "L", "RGBA"]
ImageBackend = Literal["auto", "simplejpeg", "pillow"]
ResizeBackend = Literal["auto", "opencv", "pillow"]
TensorLayout = Literal["CHW", "HWC", "NCHW", "NHWC"]
TensorDtype = Literal["uint8", "float32", "float16"]


def choices(kind: Any) -> tuple[Any, ...]:
    """The values a ``Literal`` allows, in order."""
    return get_args(kind)


def check(name: str, value: Any, kind: Any) -> None:
    """Raises ``ConfigError`` naming ``name`` if ``value`` is not one of ``kind``'s."""
    allowed = get_args(kind)
    # `True == 1` and `hash(True) == hash(1)`: compare types too, so 1 is not a choice of True
    if not any(value == a and type(value) is type(a) for a in allowed):
        raise ConfigError(f"{name} must be one of {', '.join(map(repr, allowed))}; got {value!r}")

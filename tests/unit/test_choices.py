"""Choice arguments are typed as the choices they allow, and still checked at run time."""

from __future__ import annotations

import inspect
import json
import typing
from pathlib import Path
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError

CHOICES = {
    (StaticMixtureWorkSource.__init__, "shuffle"): "block",
    (StaticMixtureWorkSource.__init__, "mixture_unit"): "samples",
    (StaticMixtureWorkSource.__init__, "exhausted_policy"): "repeat",
    (Dataset.from_path, "format"): None,
    (Dataset.afrom_path, "format"): None,
    (Pipeline.__init__, "on_error"): "raise",
    (Pipeline.__init__, "engine"): "thread",
    (Pipeline.ensure_mixture, "weight_by"): "samples",
    (Pipeline.ensure_mixture, "on_surplus"): "emit",
    (Pipeline.pack, "algorithm"): "concat",
    (Pipeline.pack_sequences, "algorithm"): "best_fit",
    (Pipeline.tokenize, "special_tokens"): None,
    (Pipeline.tokenize, "padding"): False,
    (Pipeline.tokenize_chat, "loss_on"): "assistant",
    (Pipeline.to_training, "position_ids"): "row",
    (Pipeline.decode_image, "mode"): "RGB",
    (Pipeline.decode_image, "backend"): "auto",
    (Pipeline.resize, "backend"): "auto",
    (Pipeline.random_resized_crop, "backend"): "auto",
    (Pipeline.to_tensor, "layout"): "CHW",
    (Pipeline.to_tensor, "dtype"): "uint8",
}


def _literals(hint: Any) -> set[Any]:
    if typing.get_origin(hint) is typing.Literal:
        return set(typing.get_args(hint))
    return {v for arg in typing.get_args(hint) for v in _literals(arg)}


@pytest.mark.parametrize(("fn", "name"), list(CHOICES), ids=lambda x: getattr(x, "__qualname__", x))
def test_every_choice_argument_is_a_literal_of_what_is_allowed(fn: Any, name: str) -> None:
    hints = typing.get_type_hints(fn)
    allowed = _literals(hints[name])
    assert allowed, f"{fn.__qualname__}({name}) is typed {hints[name]}, not a Literal"
    default = inspect.signature(fn).parameters[name].default
    assert default is None or default in allowed


@pytest.fixture
def ds(tmp_path: Path) -> Dataset:
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps({"i": i}) for i in range(8)) + "\n")
    return Dataset.from_path("a", str(tmp_path), index_cache=False)


@pytest.mark.parametrize(
    "make",
    [
        lambda ds: Dataset.from_path("x", ds.root, format="csv"),
        lambda ds: StaticMixtureWorkSource([ds], shuffle="random"),
        lambda ds: StaticMixtureWorkSource([ds], mixture_unit="bytes"),
        lambda ds: StaticMixtureWorkSource([ds], exhausted_policy="cycle"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1, on_error="ignore"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1, engine="fork"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).ensure_mixture("bytes"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).pack(8, algorithm="greedy"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).decode_image(mode="CMYK"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).resize(8, backend="skimage"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).to_tensor(layout="CWH"),
        lambda ds: Pipeline(StaticMixtureWorkSource([ds]), 0, 1).tokenize(
            "bytes", padding="longest", max_length=8
        ),
    ],
)
def test_an_untyped_caller_passing_another_value_gets_a_config_error(
    ds: Dataset, make: Any
) -> None:
    with pytest.raises(ConfigError):
        make(ds)


def test_the_format_registry_is_the_format_choices() -> None:
    """``format=`` allows exactly the formats the registry lists; a format found by its
    extension brings its index builder and codec with it."""
    from zephon.choices import DatasetFormat, choices
    from zephon.dataset.registry import FORMATS

    assert set(FORMATS) == set(choices(DatasetFormat))
    for name, found in FORMATS.items():
        if found.found_by == "extension":
            assert found.extensions and found.index is not None and found.codec is not None, name


def test_every_codec_is_a_codec() -> None:
    from zephon.formats.codec import BaseCodec, Codec
    from zephon.formats.jsonl import JsonlCodec
    from zephon.formats.lance import LanceCodec
    from zephon.formats.litdata import LitDataCodec
    from zephon.formats.mds import MdsCodec
    from zephon.formats.parquet import ParquetCodec
    from zephon.formats.project import ProjectedCodec
    from zephon.formats.vortex import VortexCodec
    from zephon.formats.webdataset import WebDatasetCodec

    for cls in (
        JsonlCodec,
        LanceCodec,
        LitDataCodec,
        MdsCodec,
        ParquetCodec,
        ProjectedCodec,
        VortexCodec,
        WebDatasetCodec,
    ):
        assert issubclass(cls, BaseCodec), cls
        members = ["reads_itself", "takes_arrays", "decode", "use_disk_cache", "bind_storage"]
        assert all(m in Codec.__annotations__ or hasattr(Codec, m) for m in members)
        assert all(hasattr(cls, m) for m in members), cls

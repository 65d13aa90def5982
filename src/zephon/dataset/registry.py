"""The formats Zephon reads, in one table.

A format whose shards are files of their own (JSONL, Parquet, WebDataset, Vortex) is one
:class:`Format` entry here and its module in :mod:`zephon.formats`: the extensions that name
its shards, how a shard's index is built, and its codec. Discovery (:mod:`.discover`) reads
this table and nothing format-specific. MDS and LitData (an ``index.json`` lists the shards)
and Lance (a directory with a manifest) are found by their metadata, not by extension; they
are listed too, with the discovery that reads that metadata.
"""

from __future__ import annotations

import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from zephon.dataset.builders import build_jsonl, build_parquet, build_tar
from zephon.formats.codec import Codec
from zephon.refs import ObjectInfo
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate
from zephon.storage.keep import ScanKeep

__all__ = ["FORMATS", "JSONL_COMPRESSIONS", "SHARD_FORMATS", "Format", "Found"]

JSONL_COMPRESSIONS = ("", ".gz", ".zst", ".zstd", ".bz2", ".xz")


class Found(Protocol):
    """What discovery knows of a dataset when it builds indexes and the codec."""

    name: str
    root: str
    storage: ManagedStorage
    columns: list[str] | None
    keep: ScanKeep | None
    scan_gate: CapacityGate  # scanned bytes in flight, all shards together
    allow_pickle: bool


@dataclass(frozen=True)
class Format:
    """One format Zephon reads.

    Attributes:
        name: as ``format=`` and checkpoints name it.
        found_by: ``"extension"`` (each shard a file named so), ``"index_json"`` (an
            ``index.json`` lists the shards) or ``"manifest"`` (a dataset directory).
        extensions: shard names end so (lower case), for ``found_by="extension"``.
        index: a shard's index, read from the shard, for ``found_by="extension"``.
        codec: the dataset's codec, for ``found_by="extension"``.
        projects_itself: its codec reads only the requested ``columns``; others decode
            whole records and keep the requested fields.
    """

    name: str
    found_by: Literal["extension", "index_json", "manifest"]
    extensions: tuple[str, ...] = ()
    index: Callable[[Found, ObjectInfo], Awaitable[Any]] | None = None
    codec: Callable[[Found], Codec] | None = None
    projects_itself: bool = False


def _format(name: str) -> Any:
    """A format's module, imported when a dataset of that format is first found: reading
    JSONL never loads pyarrow."""
    return importlib.import_module(f"zephon.formats.{name}")


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        Format(
            "jsonl",
            "extension",
            tuple(f"{base}{z}" for base in (".jsonl", ".json") for z in JSONL_COMPRESSIONS),
            lambda ctx, info: build_jsonl(ctx.storage, info, ctx.name, ctx.keep, ctx.scan_gate),
            lambda ctx: _format("jsonl").JsonlCodec(ctx.name),
        ),
        Format(
            "parquet",
            "extension",
            (".parquet", ".pq"),
            lambda ctx, info: build_parquet(ctx.storage, info, ctx.name, None, ctx.keep),
            lambda ctx: _format("parquet").ParquetCodec(ctx.name, ctx.columns),
            projects_itself=True,
        ),
        Format("mds", "index_json"),
        Format(
            "webdataset",
            "extension",
            (".tar",),
            lambda ctx, info: build_tar(ctx.storage, info, ctx.name, ctx.keep, ctx.scan_gate),
            lambda ctx: _format("webdataset").WebDatasetCodec(ctx.name),
        ),
        Format("litdata", "index_json"),
        Format(
            "vortex",
            "extension",
            (".vortex",),
            lambda ctx, info: _format("vortex").vortex_index(
                ctx.storage, info, ctx.name, ctx.columns
            ),
            lambda ctx: _format("vortex").VortexCodec(ctx.name, ctx.root, ctx.columns),
            projects_itself=True,
        ),
        Format("lance", "manifest", projects_itself=True),
    )
}
SHARD_FORMATS = {name: f for name, f in FORMATS.items() if f.found_by == "extension"}

"""What object names say: the format an extension implies, shard order, and which files
beside the shards are never shards."""

from __future__ import annotations

import re
from typing import Any

from zephon.dataset.registry import JSONL_COMPRESSIONS, SHARD_FORMATS
from zephon.refs import path_of

__all__ = ["basename", "format_of", "is_jsonl_by_name", "natural_key", "not_a_shard"]

_DIGITS = re.compile(r"(\d+)")


def natural_key(uri: str) -> tuple[Any, ...]:
    """Sort key that orders ``shard-2`` before ``shard-10``."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(uri))


def format_of(uri: str) -> str | None:
    """The format an object's extension implies, or ``None``."""
    lower = path_of(uri).lower()
    for name, found in SHARD_FORMATS.items():
        if lower.endswith(found.extensions):
            return name
    return None


def is_jsonl_by_name(uri: str) -> bool:
    """A ``.jsonl`` file (compressed or not): JSON Lines by name, where a ``.json`` file may
    as well be another tool's metadata."""
    lower = path_of(uri).lower()
    return lower.endswith(tuple(f".jsonl{z}" for z in JSONL_COMPRESSIONS))


def basename(uri: str) -> str:
    return uri.rstrip("/").rsplit("/", 1)[-1]


# Files that sit beside shards in real layouts and are never samples: index and metadata
# files of other tools, Spark/Hadoop markers and checksums.
_SIDECARS = frozenset(
    {
        "index.json",
        "dataset_info.json",
        "dataset_dict.json",
        "state.json",
        "metadata.json",
        "stats.json",
        "_SUCCESS",
    }
)


def not_a_shard(uri: str, root: str) -> bool:
    """Not a shard: hidden (``.``/``_``) paths, known sidecar files and checksums."""
    parts = uri[len(root) :].split("/")
    if any(part.startswith((".", "_")) for part in parts):
        return True
    return parts[-1] in _SIDECARS or parts[-1].lower().endswith(".crc")

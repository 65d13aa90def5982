"""Where shard indexes are kept between runs.

- The **local index cache** (``~/.cache/zephon/index``, or ``$ZEPHON_CACHE_DIR/index``) holds
  one file per shard index, keyed by (URI, version, size, index kind). A changed shard has a new
  version, so a stale entry is never used; it is simply never read again.
- A **persistent index** (``_zephon_index.json``, written by ``zephon index``) sits beside the
  dataset and holds every shard's size, version, count and index, so that discovery costs a
  listing and one read instead of a scan.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zephon.formats.index import (
    FragmentIndex,
    RecordIndex,
    RowGroupIndex,
    StreamIndex,
    WholeIndex,
    index_from_bytes,
)
from zephon.formats.jsondata import count, parse_json

__all__ = [
    "PERSISTENT_INDEX_NAME",
    "IndexCache",
    "PersistentIndex",
    "default_cache_dir",
]

PERSISTENT_INDEX_NAME = "_zephon_index.json"
_PERSISTENT_VERSION = 1

AnyIndex = RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex


def default_cache_dir() -> Path:
    """``$ZEPHON_CACHE_DIR``, else ``$XDG_CACHE_HOME/zephon``, else ``~/.cache/zephon``."""
    explicit = os.environ.get("ZEPHON_CACHE_DIR")
    if explicit:
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "zephon"


class IndexCache:
    """Shard indexes on local disk, keyed by what identifies a shard's bytes."""

    def __init__(self, root: Path) -> None:
        self.root = root / "index"
        self.hits = 0
        self.misses = 0

    def _path(self, uri: str, version: str, size: int, kind: str) -> Path:
        key = hashlib.sha256(f"{kind}\0{uri}\0{version}\0{size}".encode()).hexdigest()
        return self.root / key[:2] / f"{key}.zix"

    def get(self, uri: str, version: str, size: int, kind: str) -> AnyIndex | None:
        try:
            data = self._path(uri, version, size, kind).read_bytes()
            index = index_from_bytes(data)
        except (OSError, ValueError):
            self.misses += 1
            return None
        self.hits += 1
        return index

    def _root_note(self, root: str, present: bool) -> Path:
        key = hashlib.sha256(f"no-index\0{root}".encode()).hexdigest()
        return self.root / "roots" / f"{key}.{'index' if present else 'none'}"

    def had_index(self, root: str) -> bool | None:
        """Whether the prefix ``root`` had a persistent index when last discovered here
        (``None``: not discovered here yet)."""
        if self._root_note(root, False).exists():
            return False
        return True if self._root_note(root, True).exists() else None

    def note_index(self, root: str, present: bool) -> None:
        """Remember whether ``root`` has a persistent index."""
        try:
            self._root_note(root, not present).unlink(missing_ok=True)
            note = self._root_note(root, present)
            note.parent.mkdir(parents=True, exist_ok=True)
            note.touch()
        except OSError:
            pass  # a note that cannot be kept only costs a round trip next time

    def put(self, uri: str, version: str, size: int, kind: str, index: AnyIndex) -> None:
        path = self._path(uri, version, size, kind)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_bytes(index.to_bytes())
            os.replace(tmp, path)
        except OSError:
            pass  # a cache that cannot be written only costs a rescan next time


@dataclass(frozen=True)
class PersistentEntry:
    path: str  # relative to the dataset root
    size_bytes: int
    version: str
    num_samples: int
    index: AnyIndex


@dataclass(frozen=True)
class PersistentIndex:
    """The content of ``_zephon_index.json``."""

    format: str
    entries: tuple[PersistentEntry, ...]
    format_meta: dict[str, Any]

    def to_bytes(self) -> bytes:
        return json.dumps(
            {
                "zephon_index": _PERSISTENT_VERSION,
                "format": self.format,
                "format_meta": self.format_meta,
                "shards": [
                    {
                        "path": e.path,
                        "size_bytes": e.size_bytes,
                        "version": e.version,
                        "num_samples": e.num_samples,
                        "index": base64.b64encode(e.index.to_bytes()).decode("ascii"),
                    }
                    for e in self.entries
                ],
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> PersistentIndex:
        """Raises ``ValueError`` if ``data`` is not a persistent index this version reads."""
        try:
            obj = parse_json(data)
            if obj.get("zephon_index") != _PERSISTENT_VERSION:
                raise ValueError(f"persistent index version {obj.get('zephon_index')!r}")
            entries = tuple(
                PersistentEntry(
                    str(s["path"]),
                    count(s["size_bytes"], "size_bytes"),
                    str(s["version"]),
                    count(s["num_samples"], "num_samples"),
                    index_from_bytes(base64.b64decode(s["index"])),
                )
                for s in obj["shards"]
            )
            return cls(str(obj["format"]), entries, dict(obj.get("format_meta") or {}))
        except (KeyError, TypeError, ValueError) as exc:  # binascii.Error is a ValueError
            raise ValueError(f"corrupt persistent index ({type(exc).__name__}: {exc})") from None

"""The Dataset: a named, ordered collection of shards with known sample counts."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from zephon.dataset.cache import (
    PERSISTENT_INDEX_NAME,
    PersistentEntry,
    PersistentIndex,
)
from zephon.dataset.construct import Discovering
from zephon.dataset.discover import Discovered, DiscoveryStats
from zephon.dataset.selecting import Selecting
from zephon.dataset.selection import Selection
from zephon.dataset.sync import run_sync
from zephon.errors import redact_uri
from zephon.formats.blob import Blob
from zephon.formats.index import (
    FragmentIndex,
    RecordIndex,
    RowGroupIndex,
    StreamIndex,
    WholeIndex,
    coalesced,
)
from zephon.refs import ShardInfo, path_of
from zephon.storage import (
    DiskCache,
    ManagedStorage,
    RetryPolicy,
    StorageLimits,
    open_storage,
)
from zephon.storage.keep import ScanKeep

T = TypeVar("T")

__all__ = ["Dataset"]

AnyIndex = RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex
_COALESCE_GAP_BYTES = 64 * 1024


class Dataset(Discovering, Selecting):
    """A named collection of shards with known sample counts, found from metadata only.

    Build one with :meth:`from_path` (sync), :meth:`afrom_path` (from async code) or
    :meth:`from_records` (in memory). Attributes: ``name``, ``format``, ``num_samples``,
    ``shards`` (``ShardInfo(uri, num_samples, size_bytes, version)``), ``root``,
    ``discovery_stats``. ``storage_options`` are kept for reading but never shown.
    """

    def __init__(
        self,
        name: str,
        found: Discovered,
        storage_options: Mapping[str, Any] | None,
        columns: Sequence[str] | None = None,
        cache: DiskCache | None = None,
    ) -> None:
        self.name = name
        self.cache = cache  # reads of this dataset's shards go through it (opt-in)
        self.format = found.format
        self.root = found.root
        self.shards: tuple[ShardInfo, ...] = tuple(found.shards)
        self.indexes: tuple[AnyIndex, ...] = tuple(found.indexes)
        self.codec = found.codec
        self.format_meta = found.format_meta
        self.discovery_stats: DiscoveryStats = found.stats
        self.columns = list(columns) if columns is not None else None
        self._storage_options = dict(storage_options or {})
        self._scan_keep = found.keep
        if found.keep is not None:
            found.keep.idle = True  # filled, and not yet read: see ScanKeep.idle
        self.codec.bind_storage(self._storage_options)  # for codecs that read by themselves
        self.selection: Selection | None = None  # take/skip/split/exclude (None: every sample)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_scan_keep"] = None  # scanned bytes stay in the process that scanned them
        return state

    def take_scan_keep(self) -> ScanKeep | None:
        """The bytes discovery's scan read (JSONL, tar without an index), handed over once:
        the first pipeline to read this dataset serves them from memory instead of fetching
        them again, and lets them go as it reads them."""
        keep, self._scan_keep = self._scan_keep, None
        if keep is not None:
            keep.idle = False
        return keep

    def __repr__(self) -> str:
        return (
            f"Dataset(name={self.name!r}, format={self.format!r}, shards={len(self.shards)}, "
            f"num_samples={self.num_samples}, root={redact_uri(self.root)!r})"
        )

    @property
    def num_samples(self) -> int:
        """Samples in all shards (those selected, after take/skip/split/exclude)."""
        if self.selection is not None:
            return int(self.selection.counts.sum())
        return sum(s.num_samples for s in self.shards)

    def fingerprint(self) -> str:
        """A digest of name, format, columns and every shard's path under the root, sample
        count and size: the same data copied to another root (a mirror bucket, a local copy)
        has the same fingerprint, so its checkpoints restore there."""
        h = hashlib.sha256(f"{self.name}\0{self.format}\0{self.columns}".encode())
        for s in self.shards:
            uri = path_of(s.uri)  # a presigned URL's signature changes, the data does not
            path = uri[len(self.root) :] if uri.startswith(self.root) else uri
            h.update(f"\0{path}\0{s.num_samples}\0{s.size_bytes}".encode())
        if self.selection is not None:
            h.update(json.dumps(self.selection.describe()).encode())
        return h.hexdigest()[:16]

    def location(self) -> dict[str, str]:
        """Where the data is and which versions of its shards: a restore at the same root
        refuses shards rewritten since the checkpoint (same paths, sizes and counts but other
        versions)."""
        cached: dict[str, str] | None = self.__dict__.get("_location")
        if cached is None:  # shards never change: a checkpoint per step must not rehash them
            h = hashlib.sha256()
            for s in self.shards:
                h.update(f"{path_of(s.uri)}\0{s.version}\0".encode())
            cached = {"root": redact_uri(self.root), "versions": h.hexdigest()[:16]}
            self.__dict__["_location"] = cached
        return dict(cached)

    # -- reading ------------------------------------------------------------------------

    def open_storage(
        self,
        *,
        limits: StorageLimits | None = None,
        retry: RetryPolicy | None = None,
        cache: DiskCache | None = None,
    ) -> ManagedStorage:
        """A storage client for this dataset's shards (the caller closes it)."""
        return open_storage(
            self.root,
            dict(self._storage_options),
            limits=limits,
            retry=retry,
            cache=cache or self.cache,
        )

    def ranges(self, shard: int, samples: Sequence[int]) -> list[tuple[int, int]]:
        """The coalesced byte ranges that hold ``samples`` of shard ``shard``."""
        index = self.indexes[shard]
        return coalesced((r for i in samples for r in index.span(i, i + 1)), _COALESCE_GAP_BYTES)

    async def aread(self, storage: ManagedStorage, shard: int, samples: Sequence[int]) -> list[Any]:
        """Fetch and decode ``samples`` (indices within shard ``shard``), in the given order."""
        info = self.shards[shard]
        ranges = self.ranges(shard, samples)
        parts = await asyncio.gather(
            *(storage.read(info.uri, a, b, version=info.version) for a, b in ranges)
        )
        blob = Blob([(a, data) for (a, _), data in zip(ranges, parts, strict=True)])
        return list(self.codec.decode(info, self.indexes[shard], blob, samples))

    async def ahead(self, n: int = 5) -> list[Any]:
        """The first ``n`` samples in storage order."""
        out: list[Any] = []
        kept = self._all()
        async with self.open_storage() as storage:
            for shard in range(len(self.shards)):
                if len(out) >= n:
                    break
                take = min(int(kept.counts[shard]), n - len(out))
                samples = kept.samples(shard, np.arange(take, dtype=np.int64))
                out.extend(await self.aread(storage, shard, samples.tolist()))
        return out

    def head(self, n: int = 5) -> list[Any]:
        """Sync :meth:`ahead`."""
        return run_sync(self.ahead(n))

    # -- persistent index ---------------------------------------------------------------

    def persistent_index(self) -> PersistentIndex:
        """Everything discovery learnt, as a :class:`PersistentIndex`."""
        entries = tuple(
            PersistentEntry(s.uri[len(self.root) :], s.size_bytes, s.version, s.num_samples, idx)
            for s, idx in zip(self.shards, self.indexes, strict=True)
        )
        return PersistentIndex(self.format, entries, self.format_meta)

    async def awrite_index(self, out: str | None = None) -> str:
        """Write the persistent index beside the dataset (or to ``out``); returns its URI."""
        target = out or self.root + PERSISTENT_INDEX_NAME
        async with open_storage(target, dict(self._storage_options)) as storage:
            await storage.write(target, self.persistent_index().to_bytes())
        return target

"""The Dataset: a named, ordered collection of shards with known sample counts."""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from zephon.choices import DatasetFormat
from zephon.dataset.cache import (
    PERSISTENT_INDEX_NAME,
    IndexCache,
    PersistentEntry,
    PersistentIndex,
    default_cache_dir,
)
from zephon.dataset.discover import Discovered, DiscoveryStats, discover, discover_lance
from zephon.dataset.locate import pinned
from zephon.dataset.records import put_records
from zephon.dataset.selecting import Selecting
from zephon.dataset.selection import Selection
from zephon.dataset.sync import run_sync
from zephon.dataset.where import check as check_where
from zephon.errors import ConfigError, redact_uri
from zephon.formats.blob import Blob
from zephon.formats.index import (
    FragmentIndex,
    RecordIndex,
    RowGroupIndex,
    StreamIndex,
    WholeIndex,
    coalesced,
)
from zephon.formats.lance import is_lance_path
from zephon.refs import ShardInfo, path_of
from zephon.storage import (
    DiskCache,
    ManagedStorage,
    MemoryStore,
    RetryPolicy,
    StorageLimits,
    open_storage,
)
from zephon.storage.keep import ScanKeep

T = TypeVar("T")

__all__ = ["Dataset"]

AnyIndex = RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex
_COALESCE_GAP_BYTES = 64 * 1024


class Dataset(Selecting):
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

    # -- construction ---------------------------------------------------------------------

    @classmethod
    async def afrom_path(
        cls,
        name: str,
        path: str | Sequence[str],
        *,
        format: DatasetFormat | None = None,
        storage_options: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        allow_pickle: bool = False,
        index: str | None = None,
        index_cache: str | Path | bool = True,
        limits: StorageLimits | None = None,
        cache_dir: str | Path | None = None,
        cache_limit_bytes: int = 64 << 30,
        keep_scan_bytes: int = 256 << 20,
        keep_scan_disk_bytes: int = 16 << 30,
        exclude: Iterable[Any] | str | None = None,
        where: Any = None,
    ) -> Dataset:
        """Discover the dataset at ``path`` (see :meth:`from_path`) from async code."""
        if where is not None:
            check_where(where)
        args: dict[str, Any] = {
            "format": format,
            "storage_options": storage_options,
            "allow_pickle": allow_pickle,
            "index": index,
            "index_cache": index_cache,
            "limits": limits,
            "cache_dir": cache_dir,
            "cache_limit_bytes": cache_limit_bytes,
        }
        scan: dict[str, Any] = {
            "keep_scan_bytes": keep_scan_bytes,
            "keep_scan_disk_bytes": keep_scan_disk_bytes,
        }
        ds = await cls._adiscover(name, path, columns=columns, **args, **scan)
        if exclude is None and where is None:
            return ds

        async def projected(columns: list[str]) -> Dataset:  # the predicate's columns alone
            if ds.format not in ("parquet", "lance"):
                return ds
            scan: dict[str, Any] = {"keep_scan_bytes": 0, "keep_scan_disk_bytes": 0}
            return await cls._adiscover(name, path, columns=columns, **args, **scan)

        cache = (
            None
            if index_cache is False
            else (default_cache_dir() if index_cache is True else Path(index_cache))
        )
        return await ds._aselected(exclude, where, projected, cache)

    @classmethod
    async def _adiscover(
        cls,
        name: str,
        path: str | Sequence[str],
        *,
        format: DatasetFormat | None,
        storage_options: Mapping[str, Any] | None,
        columns: Sequence[str] | None,
        allow_pickle: bool,
        index: str | None,
        index_cache: str | Path | bool,
        limits: StorageLimits | None,
        cache_dir: str | Path | None,
        cache_limit_bytes: int,
        keep_scan_bytes: int,
        keep_scan_disk_bytes: int,
    ) -> Dataset:
        if not name:
            raise ConfigError("a dataset needs a non-empty name")
        path = await pinned(path, storage_options)  # a Hub revision: its commit
        first = path if isinstance(path, str) else (next(iter(path), "") or "")
        if index_cache is True:
            cache: IndexCache | None = IndexCache(default_cache_dir())
        elif index_cache is False:
            cache = None
        else:
            cache = IndexCache(Path(index_cache))
        disk = DiskCache(cache_dir, cache_limit_bytes) if cache_dir is not None else None
        if format == "lance" or (format is None and is_lance_path(first)):
            if not isinstance(path, str):
                raise ConfigError("a Lance dataset is one path (the .lance directory)")
            found = await discover_lance(name, path, dict(storage_options or {}), columns)
            return cls(name, found, storage_options, columns, disk)
        async with open_storage(
            first, dict(storage_options or {}), limits=limits, cache=disk
        ) as storage:
            found = await discover(
                name,
                path,
                storage,
                format=format,
                columns=columns,
                allow_pickle=allow_pickle,
                cache=cache,
                index_uri=index,
                keep_scan_bytes=keep_scan_bytes,
                keep_scan_disk_bytes=keep_scan_disk_bytes,
            )
        return cls(name, found, storage_options, columns, disk)

    @classmethod
    def from_path(
        cls,
        name: str,
        path: str | Sequence[str],
        *,
        format: DatasetFormat | None = None,
        storage_options: Mapping[str, Any] | None = None,
        columns: Sequence[str] | None = None,
        allow_pickle: bool = False,
        index: str | None = None,
        index_cache: str | Path | bool = True,
        limits: StorageLimits | None = None,
        cache_dir: str | Path | None = None,
        cache_limit_bytes: int = 64 << 30,
        keep_scan_bytes: int = 256 << 20,
        keep_scan_disk_bytes: int = 16 << 30,
        exclude: Iterable[Any] | str | None = None,
        where: Any = None,
    ) -> Dataset:
        """Discover the dataset at ``path``. (Long because every argument is documented here.)

        Args:
            name: the dataset's name in mixtures, checkpoints and errors.
            path: a local directory, file or glob; ``s3://bucket/prefix``; ``gs://``/``gcs://``;
                ``http(s)://`` URLs of shards or of an ``index.json``; or a list of URIs.
            format: ``jsonl``, ``parquet``, ``mds``, ``webdataset``, ``litdata``, ``lance``;
                ``None`` detects it (a ``.lance`` directory, index files, then extensions).
            storage_options: fsspec-style backend settings (``endpoint_url``, ``key``...).
            columns: Parquet columns to read (others are never fetched).
            allow_pickle: allow MDS ``pkl`` / LitData ``pickle`` fields (they run code).
            index: URI of a persistent index written elsewhere with ``zephon index --out``.
            index_cache: local cache of built shard indexes: ``True`` (default location),
                a directory, or ``False``.
            limits: storage bounds used during discovery.
            cache_dir: a local disk cache of fetched byte ranges for this dataset's reads,
                shared safely by the node's processes (see :class:`~zephon.storage.DiskCache`;
                a pipeline's ``cache_dir`` overrides it).
            cache_limit_bytes: the disk cache's size limit.
            keep_scan_bytes: formats with no random-access metadata (plain JSONL, tar) are
                discovered by reading every shard once, unless a persistent index or the
                index cache already knows them. From remote stores, up to this many of the
                bytes read are kept in memory for the first pipeline over the dataset, which
                serves its reads from them instead of fetching them again (the very version
                discovered), counts them in its fetch budget (up to half of it) and lets
                them go as it reads them. ``0`` keeps none (in memory or on disk).
            keep_scan_disk_bytes: past ``keep_scan_bytes`` (or past half the fetch budget),
                up to this many more scanned bytes go to an unnamed temporary file (never more
                than half the temporary directory's free space), read back from there by the
                first epoch, so it fetches each shard once in all; the file goes when that
                pipeline stops (or the process ends). ``0`` keeps none on disk.
            exclude: samples left out (see :meth:`exclude`): sample numbers, ``(shard,
                index)`` pairs or a file of them.
            where: a ``pyarrow.compute`` expression on the samples' columns, e.g.
                ``pc.field("score") > 0.5``: only the samples it holds for are kept. Its
                columns are read once here (alone for Parquet and Lance), and the rows it
                rejects are cached on local disk per shard version with the index cache.

        Raises:
            NotFound, AccessDenied: the path, bucket or a shard.
            FormatError: unknown or mixed formats, corrupt footers, headers or indexes.
            ConfigError: invalid arguments.

        Inside a running event loop (a notebook), discovery runs on a helper thread with a
        loop of its own; from async code, ``await afrom_path(...)`` avoids blocking the loop.
        """
        return run_sync(
            cls.afrom_path(
                name,
                path,
                format=format,
                storage_options=storage_options,
                columns=columns,
                allow_pickle=allow_pickle,
                index=index,
                index_cache=index_cache,
                limits=limits,
                cache_dir=cache_dir,
                cache_limit_bytes=cache_limit_bytes,
                keep_scan_bytes=keep_scan_bytes,
                keep_scan_disk_bytes=keep_scan_disk_bytes,
                exclude=exclude,
                where=where,
            )
        )

    @classmethod
    def from_records(
        cls,
        name: str,
        records: Iterable[Mapping[str, Any]],
        *,
        samples_per_shard: int = 1000,
        store: MemoryStore | None = None,
    ) -> Dataset:
        """A dataset of in-memory records (JSON-serialisable dicts), as JSONL shards in the
        process-local memory store. Raises ``ConfigError`` for non-serialisable records."""
        store = store or MemoryStore.default()
        prefix = put_records(name, records, samples_per_shard, store)
        options = {"store": store} if store is not MemoryStore.default() else None
        return cls.from_path(name, prefix, format="jsonl", storage_options=options)

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

"""How a :class:`~zephon.dataset.core.Dataset` is made: discovered from a path (synchronously,
or from async code) or from in-memory records (a mixin of the Dataset)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

from zephon.choices import DatasetFormat
from zephon.dataset.cache import IndexCache, default_cache_dir
from zephon.dataset.discover import discover, discover_lance
from zephon.dataset.locate import pinned
from zephon.dataset.records import put_records
from zephon.dataset.sync import run_sync
from zephon.dataset.where import check as check_where
from zephon.errors import ConfigError
from zephon.formats.lance import is_lance_path
from zephon.storage import DiskCache, MemoryStore, StorageLimits, open_storage

if TYPE_CHECKING:
    from zephon.dataset.discover import Discovered

__all__ = ["Discovering"]


class Discovering:
    """The Dataset's constructors: :meth:`from_path`, :meth:`afrom_path`, :meth:`from_records`."""

    if TYPE_CHECKING:  # the Dataset's own

        def __init__(
            self,
            name: str,
            found: Discovered,
            storage_options: Mapping[str, Any] | None,
            columns: Sequence[str] | None = None,
            cache: DiskCache | None = None,
        ) -> None: ...

        format: str

        async def _aselected(
            self, exclude: Any, where: Any, projected: Any, cache: Any
        ) -> Self: ...

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
        keep_scan_bytes: int = 32 << 20,
        keep_scan_disk_bytes: int = 16 << 30,
        exclude: Iterable[Any] | str | None = None,
        where: Any = None,
        broadcast_index: bool = True,
    ) -> Self:
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
            "broadcast_index": broadcast_index,
        }
        scan: dict[str, Any] = {
            "keep_scan_bytes": keep_scan_bytes,
            "keep_scan_disk_bytes": keep_scan_disk_bytes,
        }
        ds = await cls._adiscover(name, path, columns=columns, **args, **scan)
        if exclude is None and where is None:
            return ds

        async def projected(columns: list[str]) -> Self:  # the predicate's columns alone
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
        broadcast_index: bool,
    ) -> Self:
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
                broadcast_index=broadcast_index,
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
        keep_scan_bytes: int = 32 << 20,
        keep_scan_disk_bytes: int = 16 << 30,
        exclude: Iterable[Any] | str | None = None,
        where: Any = None,
        broadcast_index: bool = True,
    ) -> Self:
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
            broadcast_index: under an initialised ``torch.distributed`` process group, rank 0
                reads a persistent index and broadcasts it to the others (one GET for the job
                instead of one per rank). Every rank must then discover the same datasets in
                the same order; ``False`` reads it on each rank (a dataset discovered on one
                rank alone).

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
                broadcast_index=broadcast_index,
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
    ) -> Self:
        """A dataset of in-memory records (JSON-serialisable dicts), as JSONL shards in the
        process-local memory store. Raises ``ConfigError`` for non-serialisable records."""
        store = store or MemoryStore.default()
        prefix = put_records(name, records, samples_per_shard, store)
        options = {"store": store} if store is not MemoryStore.default() else None
        return cls.from_path(name, prefix, format="jsonl", storage_options=options)

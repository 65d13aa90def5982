"""Vortex files (``vortex-data``, the ``vortex`` extra): each ``.vortex`` file is a shard, its
rows are samples.

Vortex reads a file by segments, and every byte it asks for comes through Zephon's storage
layer (a :class:`vortex.io.ReadBytesAt` over :class:`~zephon.storage.ManagedStorage`, pinned to
the version seen at discovery): retries, limits, version checks and every backend (S3, GCS,
Azure, HTTP, local) come with it. Discovery reads each footer for its row count (or takes it
from a persistent or cached index); a read scans the rows it needs, projected to ``columns``.
Vortex's reader runs on its own threads, so reads run off the event loop; a codec reaches
storage through a loop of its own (in worker processes too).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa

from zephon.errors import ConfigError, FormatError, ZephonError, native_reader_failure
from zephon.formats.blob import Blob
from zephon.formats.codec import BaseCodec
from zephon.formats.index import FragmentIndex
from zephon.refs import ObjectInfo, ShardInfo
from zephon.storage import ManagedStorage, open_storage

__all__ = ["VortexCodec", "vortex_index"]


def _vortex() -> Any:
    try:
        import vortex
    except ImportError:
        raise ConfigError("Vortex files need vortex-data: pip install 'zephon[vortex]'") from None
    return vortex


class _StorageReader:
    """``read_at``/``size`` for Vortex, served by ``storage`` on ``loop`` (another thread's)."""

    def __init__(
        self,
        storage: ManagedStorage,
        loop: asyncio.AbstractEventLoop,
        uri: str,
        size: int,
        version: str,
    ) -> None:
        self.storage, self.loop, self.uri, self.version, self._size = (
            storage,
            loop,
            uri,
            version,
            size,
        )

    def size(self) -> int:
        return self._size

    def read_at(self, offset: int, length: int) -> bytes:
        read = self.storage.read(self.uri, offset, offset + length, version=self.version)
        return asyncio.run_coroutine_threadsafe(read, self.loop).result()


def _open(reader: _StorageReader, dataset: str) -> Any:
    try:
        return _vortex().open_readable(reader)
    except ZephonError:
        raise
    except BaseException as exc:
        if not native_reader_failure(exc):
            raise
        raise FormatError(
            f"not a readable Vortex file ({str(exc)[:300]})", dataset=dataset, uri=reader.uri
        ) from None


@functools.cache
def _opener() -> ThreadPoolExecutor:
    """The threads that open files for discovery. Never the loop's default executor: an open
    waits for reads on the loop, and the loop's reads need that executor (local files, name
    lookups, proxy settings), so six opens at once (its size on two cores) held every thread
    and waited for each other forever."""
    return ThreadPoolExecutor(max_workers=8, thread_name_prefix="zephon-vortex-open")


async def vortex_index(
    storage: ManagedStorage, info: ObjectInfo, dataset: str, columns: Sequence[str] | None
) -> FragmentIndex:
    """The row count of a Vortex file, from its footer (read through ``storage``); checks that
    ``columns`` exist."""
    loop = asyncio.get_running_loop()
    reader = _StorageReader(storage, loop, info.uri, info.size_bytes, info.version)

    def footer() -> tuple[int, list[str]]:
        file = _open(reader, dataset)
        names = list(file.dtype.names()) if hasattr(file.dtype, "names") else []
        return int(file.footer.row_count), [str(n) for n in names]

    rows, names = await loop.run_in_executor(_opener(), footer)
    missing = [c for c in columns or () if names and c not in names]
    if missing:
        raise ConfigError(
            f"dataset {dataset!r}: no columns {missing} in {info.uri} (it has {names})"
        )
    return FragmentIndex(rows, info.size_bytes / rows if rows else 1.0)


def _close(
    loop: asyncio.AbstractEventLoop, storage: ManagedStorage, thread: threading.Thread
) -> None:
    if loop.is_running():
        done = asyncio.run_coroutine_threadsafe(storage.aclose(), loop)
        with contextlib.suppress(Exception):
            done.result(5.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5.0)
    if not thread.is_alive():
        loop.close()


class VortexCodec(BaseCodec):
    """Rows of Vortex files as ``{column: value}`` dicts, scanned through Zephon's storage."""

    format = "vortex"
    reads_itself = True  # no bytes come through Zephon's fetch stage: decode does the reading

    def __init__(self, dataset: str, root: str, columns: Sequence[str] | None) -> None:
        self.dataset, self.root = dataset, root
        self.columns = list(columns) if columns is not None else None
        self.options: dict[str, Any] = {}
        self._setup()

    def bind_storage(self, options: dict[str, Any]) -> None:
        """The storage options to read with (the dataset's; set once discovered)."""
        self.options = dict(options)

    def _setup(self) -> None:
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._storage: ManagedStorage | None = None
        self._files: dict[tuple[str, str], Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {k: self.__dict__[k] for k in ("dataset", "root", "options", "columns")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._setup()

    def _file(self, shard: ShardInfo) -> Any:
        with self._lock:
            if self._loop is None:  # storage lives on a loop of this codec's own thread
                self._loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=self._loop.run_forever, name="zephon-vortex", daemon=True
                )
                thread.start()
                self._storage = open_storage(self.root, dict(self.options))
                # closed with the codec, or at exit: no session, loop or thread outlives it
                weakref.finalize(self, _close, self._loop, self._storage, thread)
            key = (shard.uri, shard.version)
            if key not in self._files:
                assert self._storage is not None
                reader = _StorageReader(
                    self._storage, self._loop, shard.uri, shard.size_bytes, shard.version
                )
                self._files[key] = (_open(reader, self.dataset), reader)
            return self._files[key][0]

    def decode(
        self, shard: ShardInfo, index: FragmentIndex, blob: Blob, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        vx = _vortex()
        file = self._file(shard)
        wanted, where = np.unique(np.asarray(samples, dtype=np.int64), return_inverse=True)
        try:
            indices = vx.array(pa.array(wanted.astype(np.uint64)))
            found = file.scan(self.columns, indices=indices).read_all()
            rows: list[dict[str, Any]] = found.to_arrow_table().to_pylist()
        except ZephonError:
            raise
        except BaseException as exc:
            if not native_reader_failure(exc):
                raise
            raise FormatError(
                f"cannot read Vortex rows ({str(exc)[:300]})", dataset=self.dataset, uri=shard.uri
            ) from None
        if len(rows) != len(wanted):
            raise FormatError(
                f"asked for {len(wanted)} rows, Vortex returned {len(rows)}",
                dataset=self.dataset,
                uri=shard.uri,
            )
        return [rows[i] for i in where.tolist()]

"""Local files. Reads run in the default thread pool so the event loop never blocks on disk."""

from __future__ import annotations

import asyncio
import errno
import os
from pathlib import Path

from zephon.errors import AccessDenied, NotFound, ObjectChanged, StorageError
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage

__all__ = ["LocalBackend", "local_path"]


def local_path(uri: str) -> str:
    """The filesystem path of a ``file://`` URI or a plain path."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


def _version(st: os.stat_result) -> str:
    return f"{st.st_mtime_ns:x}-{st.st_size:x}"


def _translate(exc: OSError, uri: str) -> StorageError:
    if exc.errno in (errno.ENOENT, errno.ENOTDIR):
        return NotFound("no such file", uri=uri)
    if exc.errno in (errno.EACCES, errno.EPERM):
        return AccessDenied("permission denied", uri=uri)
    if exc.errno == errno.EISDIR:
        return NotFound("is a directory, not a file", uri=uri)
    return StorageError(
        f"local I/O error {errno.errorcode.get(exc.errno or 0, exc.errno)}", uri=uri
    )


class LocalBackend:
    """Files on a local or mounted filesystem. Versions are ``mtime_ns-size``."""

    def __repr__(self) -> str:
        return "LocalBackend()"

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        return await asyncio.to_thread(self._pread, uri, start, stop, version)

    def _pread(self, uri: str, start: int, stop: int, version: str | None) -> tuple[bytes, int]:
        try:
            fd = os.open(local_path(uri), os.O_RDONLY)
        except OSError as exc:
            raise _translate(exc, uri) from None
        try:
            st = os.fstat(fd)
            if version is not None and _version(st) != version:
                raise ObjectChanged("file changed since it was first seen", uri=uri)
            if start >= st.st_size:
                return b"", st.st_size
            return os.pread(fd, min(stop, st.st_size) - start, start), st.st_size
        except OSError as exc:
            raise _translate(exc, uri) from None
        finally:
            os.close(fd)

    async def head(self, uri: str) -> ObjectInfo:
        return await asyncio.to_thread(self._stat, uri)

    def _stat(self, uri: str) -> ObjectInfo:
        path = local_path(uri)
        try:
            st = os.stat(path)
        except OSError as exc:
            raise _translate(exc, uri) from None
        if not os.path.isfile(path):
            raise NotFound("not a regular file", uri=uri)
        return ObjectInfo(uri, st.st_size, _version(st))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        return await asyncio.to_thread(self._put, uri, data)

    def _put(self, uri: str, data: bytes) -> ObjectInfo:
        path = Path(local_path(uri))
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, path)  # readers see the old file or the new one, never a mix
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise _translate(exc, uri) from None
        return self._stat(uri)

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        return await asyncio.to_thread(self._list_page, prefix, token)

    def _list_page(self, prefix: str, token: str | None) -> ListPage:
        path = local_path(prefix)
        # A prefix is a string prefix of paths, like an object-store prefix: "data/" lists a
        # directory, "data/shard-" lists the files starting so.
        root = Path(path) if path.endswith(os.sep) or os.path.isdir(path) else Path(path).parent
        if not root.exists():
            # Named as given (discovery adds "/" to a path that is not a file it can see)
            raise NotFound("no such file or directory", uri=prefix.rstrip("/") or prefix)
        # Local listings are cheap and held whole: one page, no continuation token.
        found: list[str] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            found.extend(
                full
                for full in (os.path.join(dirpath, name) for name in filenames)
                if full.startswith(path)
            )
        found.sort()
        return [self._stat(p) for p in found], None

    async def aclose(self) -> None:
        return None

"""Where a dataset is: the objects a path names, or the persistent index that names them.

A directory (a prefix) with a persistent index (``zephon index``) is found with one GET of the
index, never a listing: the index names every shard with its size and version, and reads stay
pinned to those versions (a rewritten shard still raises ``ObjectChanged``). So a thousand
ranks starting at once make one request each instead of a paginated listing each, and under an
initialised ``torch.distributed`` one request in all: rank 0 reads the index and broadcasts it
(:mod:`zephon.dataset.share`). Without an index, the prefix is listed.

The local index cache notes whether a prefix had an index. A process discovering a remote
prefix alone (no process group, no ``WORLD_SIZE`` above one) that is not known to have one
sends the index probe, the listing and a read of the prefix's ``index.json`` (MDS's and
LitData's) at once: one round trip before the shards instead of three, for at most two requests
that find nothing. An index found by the probe still wins, and the others are cancelled. Ranks
of a job send the probe alone (a listing from every rank is the herd the index avoids) unless
the cache noted that the prefix had no index; then the probe and the listing go together.
"""

from __future__ import annotations

import asyncio
import fnmatch
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zephon.dataset.cache import PERSISTENT_INDEX_NAME, IndexCache, PersistentIndex
from zephon.dataset.share import group_world, shared_read
from zephon.errors import ConfigError, FormatError, NotFound, StorageError
from zephon.refs import ObjectInfo, path_of
from zephon.storage import ManagedStorage
from zephon.storage.uri import canonical, scheme_of

__all__ = ["Located", "locate", "read_whole"]

_GLOB = re.compile(r"[*?\[]")


def _is_glob(path: str) -> bool:
    """A pattern to match against a listing; never an HTTP URL (HTTP cannot list, and ``?``
    there starts a query: a presigned URL's signature)."""
    return bool(_GLOB.search(path)) and scheme_of(path) not in ("http", "https")


@dataclass
class Located:
    """The objects a path names (``listed``: whether a listing found them), its root, and
    the persistent index found on the way (with where it was)."""

    objects: list[ObjectInfo]
    root: str
    listed: bool
    persistent: PersistentIndex | None = None
    index_uri: str = ""
    metadata: bytes | None = None  # the root's index.json, read beside the listing

    async def read_metadata(self, storage: ManagedStorage, listed: ObjectInfo) -> bytes:
        """The root's ``index.json`` as listed: the bytes read beside the listing if they
        are its size (written at about the same moment otherwise), else read again, pinned
        to the listed version."""
        if self.metadata is not None and len(self.metadata) == listed.size_bytes:
            return self.metadata
        return await read_whole(storage, listed)


async def pinned(
    path: str | Sequence[str], options: Mapping[str, Any] | None
) -> str | Sequence[str]:
    """``path`` with a Hugging Face Hub revision resolved to its commit (``hf://``); any
    other path as it is."""
    if isinstance(path, str):
        if scheme_of(path) != "hf":
            return path
        from zephon.storage.hf import pin

        return await pin(path, dict(options or {}))
    return [await pinned(p, options) for p in path]  # type: ignore[misc]


async def locate(
    storage: ManagedStorage,
    path: str | Sequence[str],
    index_uri: str | None,
    format: str | None,
    name: str,
    cache: IndexCache | None = None,
    broadcast: bool = True,
    metadata: bool = True,
) -> Located:
    """The dataset's objects: from its persistent index when a prefix has one (or ``index_uri``
    names one), else from a listing, a glob or the named objects. ``metadata``: the format may
    be one an ``index.json`` describes (read it beside the listing when alone)."""
    if isinstance(path, str) and not _is_glob(path):
        root = _absolute(path)
        if root.endswith("/") or not _has_key(root):
            root = root if root.endswith("/") else root + "/"
            seen = cache.had_index(root) if cache is not None and index_uri is None else None
            speculate = (
                index_uri is None
                and seen is not True
                and scheme_of(root) not in ("file", "memory")
                and _alone()
            )
            listing = (
                asyncio.ensure_future(_resolve(storage, path))
                if speculate or seen is False
                else None
            )
            meta = (
                asyncio.ensure_future(_read_small(storage, root + "index.json"))
                if speculate and metadata
                else None
            )
            try:
                found = await _persistent(
                    storage, index_uri or root + PERSISTENT_INDEX_NAME, name, broadcast
                )
            except BaseException:
                await _cancel(listing)
                await _cancel(meta)
                raise
            if found is not None and format in (None, found.format):
                await _cancel(listing)
                await _cancel(meta)
                if cache is not None:
                    cache.note_index(root, True)
                objects = [
                    ObjectInfo(root + e.path, e.size_bytes, e.version) for e in found.entries
                ]
                return Located(objects, root, False, found, index_uri or root)
            if cache is not None and index_uri is None and found is None:
                cache.note_index(root, False)
            if listing is not None:
                try:
                    objects, root = await listing
                except BaseException:
                    await _cancel(meta)
                    raise
                return Located(objects, root, True, metadata=await meta if meta else None)
    objects, root = await _resolve(storage, path)
    return Located(objects, root, True)


def _alone() -> bool:
    """Whether this process discovers alone: no process group of more than one rank, and no
    launcher's ``WORLD_SIZE`` above one (ranks may discover before the group is up)."""
    try:
        world = int(os.environ.get("WORLD_SIZE") or 1)
    except ValueError:
        world = 1
    return world <= 1 and group_world() is None


async def _read_small(storage: ManagedStorage, uri: str) -> bytes | None:
    """The object at ``uri`` if it exists and fits one read; ``None`` otherwise, whatever the
    reason (it is read again, pinned to its listed version, if the listing shows it)."""
    try:
        raw = await storage.read(uri, 0, _FIRST_READ)
    except StorageError:
        return None
    return raw if len(raw) < _FIRST_READ else None


async def _cancel(task: asyncio.Future[Any] | None) -> None:
    """Stop a listing that is no longer wanted (its outcome, an error included, is moot)."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait([task])
    if not task.cancelled():
        task.exception()  # retrieved: an error of a moot listing is not reported


_FIRST_READ = 1 << 20  # an index this small (about 10,000 shards) comes in one GET


async def _persistent(
    storage: ManagedStorage, uri: str, name: str, broadcast: bool
) -> PersistentIndex | None:
    """The persistent index at ``uri``, or ``None``. One GET, no HEAD first: every request
    before the first sample is a round trip every rank pays; with ``broadcast`` and an
    initialised ``torch.distributed``, only rank 0 pays it (see :mod:`zephon.dataset.share`)."""

    async def read() -> bytes:
        raw = await storage.read(uri, 0, _FIRST_READ)
        if len(raw) == _FIRST_READ:  # a larger index: the rest, pinned to what was just read
            info = await storage.stat(uri)
            raw = await read_whole(storage, info)
        return raw

    if broadcast:
        raw = await shared_read(uri, read)
    else:
        try:
            raw = await read()
        except NotFound:
            raw = None
    if raw is None:
        return None
    try:
        return PersistentIndex.from_bytes(raw)
    except ValueError as exc:
        raise FormatError(str(exc), dataset=name, uri=uri) from None


def _has_key(path: str) -> bool:
    return "://" not in path or path.split("://", 1)[1].strip("/").count("/") > 0


def _absolute(path: str) -> str:
    path = canonical(path)  # listings spell gcs:// as gs://
    if scheme_of(path) == "file":
        local = path[len("file://") :] if path.startswith("file://") else path
        absolute = os.path.abspath(local)
        return absolute + ("/" if local.endswith("/") and absolute != "/" else "")
    return path


async def _resolve(
    storage: ManagedStorage, path: str | Sequence[str]
) -> tuple[list[ObjectInfo], str]:
    """The objects a path names and the dataset root (a prefix ending in '/')."""
    if not isinstance(path, str):
        uris = [_absolute(p) for p in path]
        if not uris:
            raise ConfigError("path is an empty list")
        infos = list(await asyncio.gather(*(storage.stat(u) for u in uris)))
        dirs = [path_of(u).rsplit("/", 1)[0] + "/" for u in uris]
        root = os.path.commonprefix(dirs)  # noqa: RUF071  (URIs, not OS paths)
        return infos, root[: root.rfind("/") + 1]
    path = _absolute(path)
    match = _GLOB.search(path) if _is_glob(path) else None
    if match:
        prefix = path[: match.start()]
        root = prefix.rsplit("/", 1)[0] + "/"
        infos = [i async for i in storage.list(root) if fnmatch.fnmatchcase(i.uri, path)]
        if not infos:
            raise NotFound("no objects match the pattern", uri=path)
        return infos, root
    if _has_key(path) and not path.endswith("/"):
        try:
            info = await storage.stat(path)
            return [info], path_of(path).rsplit("/", 1)[0] + "/"
        except NotFound:
            if scheme_of(path) in ("http", "https", "hf"):  # a file named, not a prefix
                raise
    root = path if path.endswith("/") else path + "/"
    infos = [i async for i in storage.list(root)]
    if not infos:
        raise NotFound("no objects under the prefix", uri=root)
    return infos, root


async def read_whole(storage: ManagedStorage, info: ObjectInfo) -> bytes:
    return await storage.read(info.uri, 0, info.size_bytes, version=info.version)

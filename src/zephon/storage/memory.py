"""In-memory objects: a process-local object store for tests, examples and ``from_records``."""

from __future__ import annotations

import bisect
import hashlib

from zephon.errors import NotFound, ObjectChanged
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage

__all__ = ["MemoryBackend", "MemoryStore"]

_PAGE = 1000


class MemoryStore:
    """A sorted map of ``memory://...`` URIs to bytes. An object's version is a digest of
    its bytes (like an S3 etag): a rewrite with other bytes changes it, the same bytes in
    another process have the same version."""

    _default: MemoryStore | None = None

    def __init__(self) -> None:
        self._keys: list[str] = []
        self._objects: dict[str, tuple[bytes, str]] = {}

    @classmethod
    def default(cls) -> MemoryStore:
        """The store behind ``memory://`` URIs opened without an explicit store."""
        if cls._default is None:
            cls._default = MemoryStore()
        return cls._default

    def put(self, uri: str, data: bytes) -> ObjectInfo:
        """Store ``data`` at ``uri`` (a new version)."""
        if uri not in self._objects:
            bisect.insort(self._keys, uri)
        version = hashlib.blake2b(data, digest_size=8).hexdigest()
        self._objects[uri] = (bytes(data), version)
        return ObjectInfo(uri, len(data), version)

    def delete(self, uri: str) -> None:
        """Remove the object at ``uri`` if it exists."""
        if self._objects.pop(uri, None) is not None:
            self._keys.remove(uri)

    def get(self, uri: str) -> tuple[bytes, str]:
        """``(bytes, version)`` of the object at ``uri``."""
        try:
            return self._objects[uri]
        except KeyError:
            raise NotFound("no such object", uri=uri) from None

    def keys_from(self, prefix: str, after: str | None) -> list[str]:
        """Keys under ``prefix`` in order, after ``after`` if given."""
        lo = (
            bisect.bisect_right(self._keys, after)
            if after
            else bisect.bisect_left(self._keys, prefix)
        )
        out = []
        for key in self._keys[lo:]:
            if not key.startswith(prefix):
                if key > prefix:
                    break
                continue
            out.append(key)
            if len(out) > _PAGE:
                break
        return out


class MemoryBackend:
    """Backend over a :class:`MemoryStore`."""

    def __init__(self, store: MemoryStore | None = None) -> None:
        self.store = store or MemoryStore.default()

    def __repr__(self) -> str:
        return "MemoryBackend()"

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        data, current = self.store.get(uri)
        if version is not None and current != version:
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        return data[start:stop], len(data)

    async def head(self, uri: str) -> ObjectInfo:
        data, version = self.store.get(uri)
        return ObjectInfo(uri, len(data), version)

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        return self.store.put(uri, data)

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        keys = self.store.keys_from(prefix, token)
        page = keys[:_PAGE]
        infos = [await self.head(k) for k in page]
        return infos, (page[-1] if len(keys) > _PAGE else None)

    async def aclose(self) -> None:
        return None

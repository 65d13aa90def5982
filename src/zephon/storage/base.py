"""The storage contracts.

A :class:`Backend` speaks one protocol (S3, GCS, HTTP, local files, memory) and does exactly one
attempt per call, translating every failure into a :mod:`zephon.errors` type. A :class:`Storage`
is what the rest of Zephon uses: :class:`~zephon.storage.managed.ManagedStorage` wraps a backend
with bounded concurrency, a byte budget, retries, adaptive throttling and length checks.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from zephon.refs import ObjectInfo

__all__ = ["Backend", "ListPage", "Storage"]

ListPage = tuple[list[ObjectInfo], str | None]


@runtime_checkable
class Backend(Protocol):
    """One storage protocol, one attempt per call, errors already translated."""

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        """Read bytes ``[start, stop)`` (``stop > start``) of ``uri``.

        Returns the bytes and the object's total size as the service reported it, so the caller
        can tell a short read at the end of the object from a truncated body. A ``start`` at or
        past the end returns ``(b"", start)``. With ``version`` set, a different current version
        raises ``ObjectChanged``.
        """
        ...

    async def head(self, uri: str) -> ObjectInfo:
        """Size and version of ``uri``; ``NotFound`` if absent."""
        ...

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the whole of ``uri`` (atomically where the store allows)."""
        ...

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        """One page of objects whose URI starts with ``prefix``, sorted by key, and the token of
        the next page (``None`` at the end)."""
        ...

    async def aclose(self) -> None:
        """Release connections and sessions."""
        ...


class Storage(Protocol):
    """The async storage interface the rest of Zephon uses."""

    async def read(
        self, uri: str, start: int = 0, stop: int | None = None, *, version: str | None = None
    ) -> bytes:
        """Bytes ``[start, stop)`` of ``uri`` (clipped to the object's end, like slicing)."""
        ...

    async def stat(self, uri: str) -> ObjectInfo:
        """Size and version of ``uri``."""
        ...

    async def write(self, uri: str, data: bytes) -> ObjectInfo:
        """Write ``data`` as the whole object ``uri``; used for indexes, not for training data."""
        ...

    def list(self, prefix: str) -> AsyncIterator[ObjectInfo]:
        """Every object under ``prefix`` in key order, paginated lazily."""
        ...

    async def aclose(self) -> None:
        """Release every connection."""
        ...

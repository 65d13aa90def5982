"""Plain HTTP(S) objects read with ranged GETs through aiohttp.

Versions are the server's strong ETag (checked with ``If-Match``) or, without one, its
``Last-Modified`` date (checked with ``If-Unmodified-Since``). HTTP has no listing, so
``list`` raises ``ConfigError``: name shard URLs or an index file instead.
``storage_options``: ``headers`` (e.g. an ``Authorization`` header; never logged).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from zephon.errors import (
    ConfigError,
    ObjectChanged,
    redact_uri,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http_status import (
    error_for_connection,
    error_for_status,
    total_from_content_range,
)

__all__ = ["HTTPBackend"]

_LAST_MODIFIED = "lm:"


class HTTPBackend:
    """Objects at ``http://`` and ``https://`` URLs.

    Args:
        storage_options: ``{"headers": {...}}`` sent with every request.
        max_connections: connection pool size; match it to the request limit.
        read_timeout_s: socket read timeout of one attempt.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        *,
        max_connections: int = 64,
        read_timeout_s: float = 60.0,
    ) -> None:
        options = dict(storage_options or {})
        unknown = set(options) - {"headers"}
        if unknown:
            raise ConfigError(f"unknown HTTP storage_options {sorted(unknown)}; known: ['headers']")
        self._headers: dict[str, str] = dict(options.get("headers") or {})
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HTTPBackend(headers={sorted(self._headers)!r})"  # names only, never values

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(sock_read=self._read_timeout_s),
                headers=self._headers,
            )
        return self._session

    async def _call(
        self, method: str, uri: str, headers: dict[str, str], read: bool = True
    ) -> tuple[int, Any, bytes]:
        try:
            async with self._get_session().request(method, uri, headers=headers) as resp:
                body = await resp.read() if method == "GET" and read else b""
                return resp.status, resp.headers, body
        except (aiohttp.ClientError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise error_for_connection(exc, uri) from None

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
        if version is not None:
            if version.startswith(_LAST_MODIFIED):
                headers["If-Unmodified-Since"] = version[len(_LAST_MODIFIED) :]
            else:
                headers["If-Match"] = version
        status, resp_headers, body = await self._call("GET", uri, headers)
        if status == 416:
            return b"", start
        if status not in (200, 206):
            raise error_for_status(status, uri)
        if version is not None and _version_of(resp_headers) not in (None, version):
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        if status == 200:  # the server ignored the range and sent everything
            return body[start:stop], len(body)
        total = total_from_content_range(resp_headers.get("Content-Range"))
        return body, total if total is not None else start + len(body)

    async def head(self, uri: str) -> ObjectInfo:
        status, headers, _ = await self._call("HEAD", uri, {"Accept-Encoding": "identity"})
        size = headers.get("Content-Length")
        if status in (403, 405):  # HEAD refused: a presigned URL is signed for GET alone
            status, headers, _ = await self._call(
                "GET", uri, {"Range": "bytes=0-0", "Accept-Encoding": "identity"}, read=False
            )
            size = (
                total_from_content_range(headers.get("Content-Range"))
                if status == 206
                else headers.get("Content-Length")
            )
        if status not in (200, 206):
            raise error_for_status(status, uri)
        if size is None:
            raise ConfigError(
                f"server sent no Content-Length for {redact_uri(uri)}; cannot read by range"
            )
        return ObjectInfo(uri, int(size), _version_of(headers) or "")

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        raise ConfigError(f"HTTP storage is read-only; cannot write {uri}")

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        raise ConfigError(
            f"HTTP cannot list {prefix}: give shard URLs, or the URL of an index file"
        )

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _version_of(headers: Any) -> str | None:
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return str(etag)
    modified = headers.get("Last-Modified")
    return _LAST_MODIFIED + modified if modified else None

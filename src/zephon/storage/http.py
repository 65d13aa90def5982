"""Plain HTTP(S) objects read with ranged GETs through aiohttp.

Versions are the server's strong ETag (checked with ``If-Match``) or, without one, its
``Last-Modified`` date (checked with ``If-Unmodified-Since``). HTTP has no listing, so
``list`` raises ``ConfigError``: name shard URLs or an index file instead.
``storage_options``: ``headers`` (e.g. an ``Authorization`` header; never logged).
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from zephon.errors import (
    ConfigError,
    ObjectChanged,
    ZephonError,
    redact_uri,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http_status import (
    error_for_connection,
    error_for_status,
    read_body,
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
        connect_timeout_s: time to open a connection (unbounded when ``None``).
        ssl: aiohttp's ``ssl`` argument: ``False`` skips certificate checks, a context
            chooses the CA bundle.
        trust_env: take proxies from ``HTTP(S)_PROXY`` / ``NO_PROXY`` (read once per host;
            aiohttp's own ``trust_env`` would also add ``~/.netrc`` credentials, and looks
            both up on a thread for every request).
        translate: the Zephon error for a request that got no answer, and the URI it names.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        *,
        max_connections: int = 64,
        read_timeout_s: float = 60.0,
        connect_timeout_s: float | None = None,
        ssl: _ssl.SSLContext | bool = True,
        trust_env: bool = False,
        translate: Callable[[BaseException, str], ZephonError] = error_for_connection,
    ) -> None:
        options = dict(storage_options or {})
        unknown = set(options) - {"headers"}
        if unknown:
            raise ConfigError(f"unknown HTTP storage_options {sorted(unknown)}; known: ['headers']")
        self._headers: dict[str, str] = dict(options.get("headers") or {})
        self._max_connections = max_connections
        self._timeout = aiohttp.ClientTimeout(
            sock_read=read_timeout_s, sock_connect=connect_timeout_s
        )
        self._ssl = ssl
        self._proxies: dict[tuple[str, str], str | None] | None = {} if trust_env else None
        self._translate = translate
        self._session: aiohttp.ClientSession | None = None

    def __repr__(self) -> str:
        return f"HTTPBackend(headers={sorted(self._headers)!r})"  # names only, never values

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                auto_decompress=False,
                timeout=self._timeout,
                headers=self._headers,
            )
        return self._session

    def _proxy_for(self, url: str) -> str | None:
        """The environment's proxy for ``url``'s scheme and host, if any (``NO_PROXY``
        applied), looked up once per host."""
        if self._proxies is None:
            return None
        parts = urlsplit(url)
        key = (parts.scheme, parts.hostname or "")
        if key not in self._proxies:
            found = urllib.request.getproxies_environment()
            proxy = found.get(parts.scheme)
            bypass = urllib.request.proxy_bypass_environment(key[1], found)  # type: ignore[attr-defined]
            self._proxies[key] = None if proxy is None or bypass else proxy
        return self._proxies[key]

    async def request(
        self, method: str, url: str, headers: dict[str, str], read: bool = True, *, uri: str = ""
    ) -> tuple[int, Any, bytes]:
        """One request: its status, headers and (for a GET) body; a failed connection is a
        Zephon error naming ``uri`` (``url`` where not given: a signed URL is named by the
        object it reads)."""
        uri = uri or url
        try:
            proxy = self._proxy_for(url)
            session = self._get_session()
            async with session.request(method, url, headers=headers, proxy=proxy) as resp:
                body = await read_body(resp) if method == "GET" and read else b""
                return resp.status, resp.headers, body
        except (aiohttp.ClientError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise self._translate(exc, uri) from None

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        status, headers, body = await self.request("GET", uri, range_headers(start, stop, version))
        if status not in (200, 206, 416):
            raise error_for_status(status, uri)
        return ranged_answer(status, headers, body, start, stop, version, uri)

    async def head(self, uri: str) -> ObjectInfo:
        status, headers, _ = await self.request("HEAD", uri, {"Accept-Encoding": "identity"})
        size = headers.get("Content-Length")
        if status in (403, 405):  # HEAD refused: a presigned URL is signed for GET alone
            status, headers, _ = await self.request(
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


def range_headers(start: int, stop: int, version: str | None) -> dict[str, str]:
    """The headers of a GET of bytes ``[start, stop)`` of the version ``version``."""
    headers = {"Range": f"bytes={start}-{stop - 1}", "Accept-Encoding": "identity"}
    if version is not None:
        if version.startswith(_LAST_MODIFIED):
            headers["If-Unmodified-Since"] = version[len(_LAST_MODIFIED) :]
        else:
            headers["If-Match"] = version
    return headers


def ranged_answer(
    status: int, headers: Any, body: bytes, start: int, stop: int, version: str | None, uri: str
) -> tuple[bytes, int]:
    """The bytes and the object's size from a 200, 206 or 416 answer to a ranged GET."""
    if status == 416:  # start at or past the end: an empty slice
        return b"", start
    if version is not None and _version_of(headers) not in (None, version):
        raise ObjectChanged("object changed since it was first seen", uri=uri)
    if status == 200:  # the server ignored the range and sent everything
        return body[start:stop], len(body)
    total = total_from_content_range(headers.get("Content-Range"))
    return body, total if total is not None else start + len(body)


def _version_of(headers: Any) -> str | None:
    etag = headers.get("ETag")
    if etag and not etag.startswith("W/"):
        return str(etag)
    modified = headers.get("Last-Modified")
    return _LAST_MODIFIED + modified if modified else None

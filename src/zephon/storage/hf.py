"""Datasets on the Hugging Face Hub: ``hf://datasets/org/name[@revision]/path``.

Files are read by byte range from the Hub's ``resolve`` endpoint (large files redirect to
its CDN); a prefix is listed with the ``tree`` API. A revision (a branch, a tag, a commit, or
``refs/convert/parquet``, written ``refs%2Fconvert%2Fparquet``) is resolved to its commit
once, when a dataset is discovered (:func:`pin`): every shard URI then names the commit, so a
checkpoint pins it, and a branch that moves on does not change a run.

``HF_ENDPOINT`` (default ``https://huggingface.co``) and ``HF_TOKEN`` are honoured, as are
``storage_options={"endpoint": ..., "token": ...}``. The token is sent to the Hub's own host
only (never to the CDN a large file redirects to) and never appears in a repr, an error or a
log record.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from typing import Any
from urllib.parse import quote, unquote

import aiohttp
from yarl import URL

from zephon.errors import (
    AccessDenied,
    ConfigError,
    NotFound,
    StorageError,
    Throttled,
    TransientStorageError,
    Unreachable,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http_status import (
    error_for_connection,
    error_for_status,
    read_body,
    total_from_content_range,
)

__all__ = ["HFBackend", "HFPath", "pin"]

DEFAULT_ENDPOINT = "https://huggingface.co"
_NEXT = re.compile(r'<([^>]+)>;\s*rel="next"')
_PIN_ATTEMPTS = 6
_MAX_REDIRECTS = 5


def _origin(url: str) -> tuple[str, str, int | None]:
    u = URL(url)
    return (u.scheme, u.host or "", u.port)


class HFPath:
    """``hf://datasets/org/name[@revision]/path`` split into its parts."""

    def __init__(self, uri: str) -> None:
        rest = uri[len("hf://") :] if uri.startswith("hf://") else ""
        kind, _, rest = rest.partition("/")
        parts = rest.split("/", 2)
        if kind != "datasets" or len(parts) < 2 or not parts[0] or not parts[1]:
            raise ConfigError(
                f"not a Hugging Face dataset path: {uri!r}; write "
                "hf://datasets/org/name[@revision]/path"
            )
        name, _, revision = parts[1].partition("@")
        self.repo = f"{parts[0]}/{name}"
        self.revision = unquote(revision) if revision else "main"
        self.path = parts[2] if len(parts) > 2 else ""

    def uri(self, path: str | None = None, revision: str | None = None) -> str:
        """The URI of ``path`` (default: this one's) at ``revision`` (default: this one's)."""
        rev = quote(revision or self.revision, safe="")
        return f"hf://datasets/{self.repo}@{rev}/{self.path if path is None else path}"


def _endpoint(options: dict[str, Any]) -> str:
    return str(options.get("endpoint") or os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT)


def _token(options: dict[str, Any]) -> str | None:
    token = options.get("token") or os.environ.get("HF_TOKEN")
    return str(token) if token else None


class HFBackend:
    """Files of Hugging Face Hub dataset repositories.

    Args:
        storage_options: ``endpoint`` (default ``HF_ENDPOINT`` or the Hub) and ``token``
            (default ``HF_TOKEN``; needed for private and gated repositories).
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
        unknown = set(options) - {"endpoint", "token"}
        if unknown:
            raise ConfigError(
                f"unknown Hugging Face storage_options {sorted(unknown)}; known: "
                "['endpoint', 'token']"
            )
        self.endpoint = _endpoint(options).rstrip("/")
        self._token = _token(options)
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._session: aiohttp.ClientSession | None = None
        self._commits: dict[tuple[str, str], str] = {}

    def __repr__(self) -> str:  # the token never
        return f"HFBackend(endpoint={self.endpoint!r}, token={'set' if self._token else None})"

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(sock_read=self._read_timeout_s),
            )
        return self._session

    def _headers(self, url: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = {"Accept-Encoding": "identity", **(extra or {})}
        if self._token and _origin(url) == _origin(self.endpoint):  # the Hub's own host only
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    async def _call(
        self, method: str, url: str, uri: str, headers: dict[str, str] | None = None
    ) -> tuple[int, Any, bytes]:
        """One request, redirects followed by hand: the token goes to the Hub's host only,
        never to the CDN a large file redirects to."""
        try:
            for _ in range(_MAX_REDIRECTS):
                async with self._get_session().request(
                    method, url, headers=self._headers(url, headers), allow_redirects=False
                ) as resp:
                    location = resp.headers.get("Location")
                    if resp.status in (301, 302, 303, 307, 308) and location:
                        url = str(resp.url.join(URL(location)))
                        continue
                    body = await read_body(resp) if method == "GET" else b""
                    return resp.status, resp.headers, body
        except (aiohttp.ClientError, ConnectionError, OSError, asyncio.IncompleteReadError) as exc:
            raise error_for_connection(exc, uri) from None
        raise StorageError("too many redirects", uri=uri)

    def _error(self, status: int, uri: str, what: str) -> StorageError:
        """The error for a failed Hub request about ``what``, saying what to do."""
        if status in (401, 403):
            hint = "set HF_TOKEN (or storage_options token) to a token that may read it"
            if self._token:
                hint = "the token given may not read it (a gated dataset: accept its terms)"
            return AccessDenied(f"the Hub refused {what}: {hint}", uri=uri, status=status)
        if status == 404:
            return NotFound(
                f"the Hub has no {what} (check the repository name, the revision and the path"
                f"{'; a private repository needs HF_TOKEN' if not self._token else ''})",
                uri=uri,
                status=status,
            )
        if status == 429:
            return Throttled(
                "rate-limited by the Hub: wait, or set HF_TOKEN (higher limits)",
                uri=uri,
                status=status,
            )
        return error_for_status(status, uri)

    async def commit(self, repo: str, revision: str, uri: str) -> str:
        """The commit a revision of ``repo`` names (cached)."""
        key = (repo, revision)
        if key not in self._commits:
            url = f"{self.endpoint}/api/datasets/{repo}/revision/{quote(revision, safe='')}"
            status, _, body = await self._call("GET", url, uri)
            if status != 200:
                raise self._error(status, uri, f"revision {revision!r} of dataset {repo!r}")
            try:
                self._commits[key] = str(json.loads(body)["sha"])
            except (ValueError, KeyError, TypeError):
                raise StorageError("the Hub sent no commit for the revision", uri=uri) from None
        return self._commits[key]

    def _resolve_url(self, p: HFPath) -> str:
        rev = quote(p.revision, safe="")
        return f"{self.endpoint}/datasets/{p.repo}/resolve/{rev}/{quote(p.path)}"

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        p = HFPath(uri)
        headers = {"Range": f"bytes={start}-{stop - 1}"}
        status, resp_headers, body = await self._call("GET", self._resolve_url(p), uri, headers)
        if status == 416:
            return b"", start
        if status not in (200, 206):
            raise self._error(status, uri, f"file {p.path!r}")
        if status == 200:  # the server ignored the range
            return body[start:stop], len(body)
        total = total_from_content_range(resp_headers.get("Content-Range"))
        return body, total if total is not None else start + len(body)

    async def head(self, uri: str) -> ObjectInfo:
        p = HFPath(uri)
        status, headers, _ = await self._call("HEAD", self._resolve_url(p), uri)
        if status not in (200, 206):
            raise self._error(status, uri, f"file {p.path!r}")
        size = headers.get("X-Linked-Size") or headers.get("Content-Length")
        if size is None:
            raise ConfigError(f"the Hub sent no size for {uri}; cannot read it by range")
        version = headers.get("X-Linked-Etag") or headers.get("ETag") or p.revision
        return ObjectInfo(uri, int(size), str(version).strip('"'))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        raise ConfigError(f"Hugging Face datasets are read-only here; cannot write {uri}")

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        p = HFPath(prefix)
        folder = p.path.rsplit("/", 1)[0] if "/" in p.path else ""
        rev = quote(p.revision, safe="")
        url = token or (
            f"{self.endpoint}/api/datasets/{p.repo}/tree/{rev}/{quote(folder)}?recursive=true"
        )
        status, headers, body = await self._call("GET", url, prefix)
        if status == 404 and folder:  # no such folder: nothing under the prefix
            return [], None
        if status != 200:
            raise self._error(status, prefix, f"dataset {p.repo!r} at {p.revision!r}")
        try:
            entries = json.loads(body)
        except ValueError:
            raise StorageError("the Hub sent a listing that is not JSON", uri=prefix) from None
        out = []
        for entry in entries if isinstance(entries, list) else []:
            if not isinstance(entry, dict) or entry.get("type") != "file":
                continue
            uri = p.uri(str(entry.get("path", "")))
            if not uri.startswith(prefix):
                continue
            lfs = entry.get("lfs") or {}
            size = lfs.get("size", entry.get("size")) or 0
            out.append(ObjectInfo(uri, int(size), str(lfs.get("oid") or entry.get("oid", ""))))
        match = _NEXT.search(headers.get("Link", "") or "")
        return sorted(out, key=lambda o: o.uri), match.group(1) if match else None

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


async def pin(uri: str, options: dict[str, Any] | None = None) -> str:
    """``uri`` with its revision resolved to the commit it names now (so that a dataset's
    shards, and the checkpoints of its runs, name that commit)."""
    p = HFPath(uri)
    backend = HFBackend(options)
    try:
        for attempt in range(_PIN_ATTEMPTS):  # retried as a storage read is
            try:
                sha = await backend.commit(p.repo, p.revision, uri)
                break
            except (Throttled, TransientStorageError, Unreachable):
                if attempt == _PIN_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(min(8.0, 0.25 * 2**attempt))
    finally:
        await backend.aclose()
    return p.uri(revision=sha)

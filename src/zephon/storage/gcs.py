"""Google Cloud Storage through gcsfs's credentials and session, over the JSON API.

gcsfs supplies what is hard to get right: Application Default Credentials, token refresh, the
``STORAGE_EMULATOR_HOST`` convention and a tuned aiohttp session. Zephon sends the object
requests itself on that session so that it sees raw status codes (gcsfs's own calls retry
internally and classify errors from message text, which would hide throttling from the
adaptive limiter and double the retries). ``storage_options``: ``token``, ``project``,
``endpoint_url``, ``requester_pays`` (a billing project name).
"""

from __future__ import annotations

import asyncio
import json
import os
import warnings
from typing import Any
from urllib.parse import quote

import aiohttp

from zephon.errors import (
    ConfigError,
    ObjectChanged,
    StorageError,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http_status import (
    error_for_connection,
    error_for_status,
    read_body,
    total_from_content_range,
)
from zephon.storage.uri import split_bucket_key

__all__ = ["GCSBackend"]

_OPTION_KEYS = {"token", "project", "endpoint_url", "requester_pays"}
_DEFAULT_ENDPOINT = "https://storage.googleapis.com"


def _endpoint(options: dict[str, Any]) -> str:
    url = options.get("endpoint_url") or os.environ.get("STORAGE_EMULATOR_HOST") or ""
    if not url:
        return _DEFAULT_ENDPOINT
    return (url if "://" in url else f"http://{url}").rstrip("/")


class GCSBackend:
    """GCS objects ``gs://bucket/key``. Versions are object generations.

    Args:
        storage_options: see the module docstring. Unknown keys raise ``ConfigError``.
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
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ConfigError(
                f"unknown GCS storage_options {sorted(unknown)}; known: {sorted(_OPTION_KEYS)}"
            )
        self._options = options
        self.endpoint_url = _endpoint(options)
        self._max_connections = max_connections
        self._read_timeout_s = read_timeout_s
        self._fs: Any = None
        self._session: aiohttp.ClientSession | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"GCSBackend(endpoint_url={self.endpoint_url!r})"

    async def _ensure(self) -> tuple[Any, aiohttp.ClientSession]:
        if self._session is None:
            async with self._lock:
                if self._session is None:
                    import gcsfs

                    token = self._options.get("token")
                    if token is None and self.endpoint_url != _DEFAULT_ENDPOINT:
                        token = "anon"  # emulators take no credentials
                    with warnings.catch_warnings():
                        # "project not set": only bucket listing needs a project; we never list
                        # buckets.
                        warnings.simplefilter("ignore", UserWarning)
                        self._fs = self._make_fs(gcsfs, token)
                    self._session = await self._fs._set_session()
        assert self._session is not None
        return self._fs, self._session

    def _make_fs(self, gcsfs: Any, token: Any) -> Any:
        return gcsfs.GCSFileSystem(
            asynchronous=True,
            skip_instance_cache=True,
            token=token,
            project=self._options.get("project"),
            endpoint_url=self.endpoint_url,
            session_kwargs={
                "connector": aiohttp.TCPConnector(limit=self._max_connections),
                "auto_decompress": False,
                "timeout": aiohttp.ClientTimeout(sock_read=self._read_timeout_s),
            },
        )

    async def _request(
        self,
        uri: str,
        url: str,
        params: dict[str, str],
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, Any, bytes]:
        fs, session = await self._ensure()
        out_headers = dict(headers or {})
        if self._options.get("requester_pays"):
            params = {**params, "userProject": str(self._options["requester_pays"])}
        try:
            fs.credentials.apply(out_headers)  # as gcsfs does: refreshes an expiring token
            method = "GET" if data is None else "POST"
            async with session.request(
                method, url, params=params, headers=out_headers, data=data
            ) as resp:
                return resp.status, resp.headers, await read_body(resp)
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise error_for_connection(exc, uri) from None

    def _object_url(self, uri: str) -> tuple[str, str]:
        bucket, key = split_bucket_key(uri)
        base = f"{self.endpoint_url}/storage/v1/b/{quote(bucket, safe='')}"
        return bucket, f"{base}/o/{quote(key, safe='')}"

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        _, url = self._object_url(uri)
        params = {"alt": "media"}
        if version is not None:
            params["ifGenerationMatch"] = version
        status, headers, body = await self._request(
            uri, url, params, {"Range": f"bytes={start}-{stop - 1}"}
        )
        if status == 416:
            return b"", start
        if status not in (200, 206):
            raise error_for_status(status, uri)
        generation = headers.get("x-goog-generation")
        if version is not None and generation is not None and generation != version:
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        if status == 200:  # the whole object: the range was not applied
            return body[start:stop], len(body)
        total = total_from_content_range(headers.get("Content-Range"))
        return body, total if total is not None else start + len(body)

    async def head(self, uri: str) -> ObjectInfo:
        _, url = self._object_url(uri)
        status, _, body = await self._request(uri, url, {"fields": "size,generation"})
        if status != 200:
            raise error_for_status(status, uri)
        meta = _json(body, uri)
        return ObjectInfo(uri, int(meta["size"]), str(meta["generation"]))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        bucket, key = split_bucket_key(uri)
        url = f"{self.endpoint_url}/upload/storage/v1/b/{quote(bucket, safe='')}/o"
        status, _, body = await self._request(
            uri,
            url,
            {"uploadType": "media", "name": key, "fields": "size,generation"},
            {"Content-Type": "application/octet-stream"},
            data=data,
        )
        if status != 200:
            raise error_for_status(status, uri)
        meta = _json(body, uri)
        return ObjectInfo(uri, int(meta["size"]), str(meta["generation"]))

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        bucket, key_prefix = split_bucket_key(prefix)
        url = f"{self.endpoint_url}/storage/v1/b/{quote(bucket, safe='')}/o"
        params = {
            "prefix": key_prefix,
            "maxResults": "1000",
            "fields": "items(name,size,generation),nextPageToken",
        }
        if token:
            params["pageToken"] = token
        status, _, body = await self._request(prefix, url, params)
        if status != 200:
            raise error_for_status(status, prefix)
        page = _json(body, prefix)
        infos = [
            ObjectInfo(f"gs://{bucket}/{item['name']}", int(item["size"]), str(item["generation"]))
            for item in page.get("items", ())
            if not item["name"].endswith("/")
        ]
        infos.sort(key=lambda info: info.uri)
        return infos, page.get("nextPageToken") or None

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _json(body: bytes, uri: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except ValueError:
        raise StorageError("GCS answered with invalid JSON", uri=uri) from None
    if not isinstance(value, dict):
        raise StorageError("GCS answered with unexpected JSON", uri=uri)
    return value

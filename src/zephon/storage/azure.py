"""Azure Blob Storage (``az://container/path``; ``abfs://`` and ``abfss://`` name the same).

Built on ``azure-storage-blob``'s asyncio client (aiohttp underneath) with the SDK's own
retries switched off: retries, limits and throttling are :class:`ManagedStorage`'s. Versions
are ETags, pinned with ``If-Match``.

Credentials, first found wins: ``storage_options`` ``connection_string``; ``account_key``,
``sas_token`` or ``credential`` (any Azure credential object) with ``account_name`` (or
``account_url``/``endpoint_url``); ``anon=True``; then the environment
(``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_NAME`` with
``AZURE_STORAGE_ACCOUNT_KEY`` or ``AZURE_STORAGE_SAS_TOKEN``); last ``DefaultAzureCredential``
when ``azure-identity`` is installed. Secrets never reach errors or reprs.
"""

from __future__ import annotations

import os
import re
from typing import Any

from zephon.errors import (
    AccessDenied,
    ConfigError,
    NotFound,
    ObjectChanged,
    StorageError,
    Throttled,
    TransientStorageError,
    Unreachable,
    ZephonError,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.uri import split_bucket_key

__all__ = ["AzureBackend"]

_OPTION_KEYS = {"connection_string", "account_name", "account_key", "sas_token", "credential",
                "account_url", "endpoint_url", "anon"}  # fmt: skip
_TOTAL = re.compile(r"/(\d+)$")
_PAGE = 1000


def _sdk() -> Any:
    try:
        from azure.storage.blob import aio
    except ImportError:
        raise ConfigError(
            "az:// URIs need azure-storage-blob: pip install 'zephon[azure]'"
        ) from None
    return aio


class AzureBackend:
    """One attempt per call against Azure Blob Storage (or Azurite)."""

    def __init__(self, options: dict[str, Any], max_connections: int = 64) -> None:
        unknown = set(options) - _OPTION_KEYS
        if unknown:
            raise ConfigError(
                f"unknown Azure storage_options {sorted(unknown)} (known: {sorted(_OPTION_KEYS)})"
            )
        self._options = dict(options)
        self._max_connections = max_connections
        self._service: Any = None

    def __repr__(self) -> str:
        return f"AzureBackend(account={self._account_url() or 'from connection string'!r})"

    def _account_url(self) -> str | None:
        o = self._options
        url = o.get("account_url") or o.get("endpoint_url")
        if url:
            return str(url).rstrip("/")
        name = o.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
        return f"https://{name}.blob.core.windows.net" if name else None

    def _client(self) -> Any:
        if self._service is not None:
            return self._service
        aio = _sdk()
        o = self._options
        kwargs = {"retry_total": 0, "connection_pool_maxsize": self._max_connections}
        conn = o.get("connection_string")
        env_conn = os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        explicit = any(o.get(k) for k in ("account_key", "sas_token", "credential", "anon"))
        if conn or (env_conn and not explicit and not self._account_url()):
            self._service = aio.BlobServiceClient.from_connection_string(conn or env_conn, **kwargs)
            return self._service
        url = self._account_url()
        if url is None:
            raise ConfigError(
                "Azure needs an account: storage_options account_name, account_url or "
                "connection_string (or AZURE_STORAGE_ACCOUNT_NAME / "
                "AZURE_STORAGE_CONNECTION_STRING)"
            )
        self._service = aio.BlobServiceClient(url, credential=self._credential(url), **kwargs)
        return self._service

    def _credential(self, url: str) -> Any:
        o = self._options
        if o.get("anon"):
            return None
        if o.get("credential") is not None:
            return o["credential"]
        key = o.get("account_key") or os.environ.get("AZURE_STORAGE_ACCOUNT_KEY")
        if key:
            name = o.get("account_name") or os.environ.get("AZURE_STORAGE_ACCOUNT_NAME")
            if not name:  # Azurite and custom endpoints: the account is the first path part
                name = url.rsplit("/", 1)[-1] if url.count("/") > 2 else url.split("//")[-1]
                name = name.split(".")[0]
            return {"account_name": name, "account_key": key}
        sas = o.get("sas_token") or os.environ.get("AZURE_STORAGE_SAS_TOKEN")
        if sas:
            return str(sas).lstrip("?")
        try:
            from azure.identity.aio import DefaultAzureCredential  # type: ignore[import-untyped]
        except ImportError:
            return None  # anonymous: a public container
        return DefaultAzureCredential()

    def _blob(self, uri: str) -> Any:
        container, name = self._split(uri)
        if not name:
            raise ConfigError(f"URI names no blob: {uri!r}")
        return self._client().get_blob_client(container, name)

    def _split(self, uri: str) -> tuple[str, str]:
        """``(container, blob name)``; the adlfs long form ``container@account.dfs.core.
        windows.net`` also names the account, used when no option or variable does."""
        bucket, name = split_bucket_key(uri)
        container, at, host = bucket.partition("@")
        if at and not self._account_url() and not self._options.get("connection_string"):
            account = host.split(".", 1)[0]
            self._options["account_url"] = f"https://{account}.blob.core.windows.net"
            self._options.setdefault("account_name", account)
        return container, name

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        from azure.core import MatchConditions

        kwargs: dict[str, Any] = {"offset": start, "length": stop - start, "max_concurrency": 1}
        if version is not None:
            kwargs.update(etag=_etag(version), match_condition=MatchConditions.IfNotModified)
        try:
            downloader = await self._blob(uri).download_blob(**kwargs)
            data = await downloader.readall()
        except Exception as exc:
            error = _translate(exc, uri)
            if error.status == 416:  # at or past the end (or an empty blob)
                return b"", start
            raise error from None
        if version is not None and _etag(downloader.properties.etag) != _etag(version):
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        found = _TOTAL.search(downloader.properties.content_range or "")
        total = int(found.group(1)) if found else start + len(data)
        return bytes(data), total

    async def head(self, uri: str) -> ObjectInfo:
        try:
            props = await self._blob(uri).get_blob_properties()
        except Exception as exc:
            raise _translate(exc, uri) from None
        return ObjectInfo(uri, int(props.size), _etag(props.etag))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        try:
            out = await self._blob(uri).upload_blob(data, overwrite=True)
        except Exception as exc:
            raise _translate(exc, uri) from None
        return ObjectInfo(uri, len(data), _etag(out["etag"]))

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        scheme = prefix.partition("://")[0]
        bucket = split_bucket_key(prefix)[0]  # listed URIs keep the prefix's spelling
        container, key = self._split(prefix)
        try:
            pages = (
                self._client()
                .get_container_client(container)
                .list_blobs(name_starts_with=key or None, results_per_page=_PAGE)
                .by_page(continuation_token=token)
            )
            page = [b async for b in await pages.__anext__()]
        except StopAsyncIteration:
            return [], None
        except Exception as exc:
            raise _translate(exc, prefix) from None
        infos = [
            ObjectInfo(f"{scheme}://{bucket}/{b.name}", int(b.size), _etag(b.etag)) for b in page
        ]
        return infos, pages.continuation_token or None

    async def aclose(self) -> None:
        service, self._service = self._service, None
        if service is not None:
            await service.close()


def _etag(value: Any) -> str:
    """An ETag as the service sends it in headers: quoted (listings leave the quotes off)."""
    text = str(value)
    return text if text.startswith('"') else f'"{text}"'


def _translate(exc: BaseException, uri: str) -> StorageError:
    """The :mod:`zephon.errors` type of an Azure SDK failure."""
    from azure.core.exceptions import (
        ClientAuthenticationError,
        HttpResponseError,
        ResourceModifiedError,
        ResourceNotFoundError,
        ServiceRequestError,
        ServiceResponseError,
    )

    if isinstance(exc, ZephonError):
        raise exc
    if isinstance(exc, ServiceRequestError):  # no connection could be made
        return Unreachable(f"connection failed ({type(exc).__name__})", uri=uri)
    if isinstance(exc, ServiceResponseError):
        return TransientStorageError(f"connection failed ({type(exc).__name__})", uri=uri)
    if not isinstance(exc, HttpResponseError):
        raise exc
    status = exc.status_code
    code = getattr(exc, "error_code", None) or None
    code = str(code) if code is not None else None
    if isinstance(exc, ResourceNotFoundError) or status == 404:
        return NotFound("no such object or container", uri=uri, status=status, code=code)
    if isinstance(exc, ClientAuthenticationError) or status in (401, 403):
        return AccessDenied("access denied", uri=uri, status=status, code=code)
    if isinstance(exc, ResourceModifiedError) or status == 412:
        return ObjectChanged(
            "object changed since it was first seen", uri=uri, status=status, code=code
        )
    if status in (429, 503) or code in ("ServerBusy", "OperationTimedOut"):
        return Throttled("throttled", uri=uri, status=status, code=code)
    if status is not None and status >= 500:
        return TransientStorageError("server error", uri=uri, status=status, code=code)
    return StorageError("request failed", uri=uri, status=status, code=code)

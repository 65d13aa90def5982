"""Amazon S3 and S3-compatible stores (MinIO, moto, R2...) through aiobotocore.

Configuration follows the AWS conventions (environment, ``~/.aws`` files, ``AWS_ENDPOINT_URL``),
overridable with fsspec/s3fs-style ``storage_options``: ``endpoint_url``, ``key``, ``secret``,
``token``, ``region_name``, ``anon``, ``profile``. botocore's own retries are switched off:
retries live in :class:`~zephon.storage.managed.ManagedStorage`, where they are counted and
where throttling feeds the adaptive limiter.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from contextlib import AsyncExitStack
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore import UNSIGNED
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    PartialCredentialsError,
)
from botocore.httpsession import get_cert_path

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
    redact_uri,
)
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http import HTTPBackend
from zephon.storage.http_status import cause_of, error_for_connection
from zephon.storage.s3_presigned import PresignedReads, presigner
from zephon.storage.uri import split_bucket_key

__all__ = ["S3Backend"]

_NOT_FOUND = {"NoSuchKey", "NoSuchBucket", "NotFound", "404", "NoSuchVersion"}
_DENIED = {
    "AccessDenied",
    "403",
    "Forbidden",
    "InvalidAccessKeyId",
    "SignatureDoesNotMatch",
    "AllAccessDisabled",
    "ExpiredToken",
    "InvalidToken",
}
_THROTTLED = {
    "SlowDown",
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "TooManyRequests",
    "TooManyRequestsException",
    "503",
    "429",
}
_TRANSIENT = {"InternalError", "RequestTimeout", "ServiceUnavailable", "500", "502", "504"}
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_CONNECTION_ERRORS = (
    BotoCoreError,
    aiohttp.ClientError,
    ConnectionError,
    TimeoutError,
    asyncio.IncompleteReadError,
)
_OPTION_KEYS = {"endpoint_url", "key", "secret", "token", "region_name", "anon", "profile"}


def translate_s3_error(exc: BaseException, uri: str) -> ZephonError:
    """Map an aiobotocore/aiohttp failure to a Zephon error by error code and HTTP status."""
    if isinstance(exc, ClientError):
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in _NOT_FOUND or status == 404:
            return NotFound("no such object or bucket", uri=uri, status=status, code=code)
        if code in _DENIED or status in (401, 403):
            return AccessDenied("access denied", uri=uri, status=status, code=code)
        if code == "PreconditionFailed" or status == 412:
            return ObjectChanged(
                "object changed since it was first seen", uri=uri, status=status, code=code
            )
        if code in _THROTTLED or status in (429, 503):
            return Throttled("throttled", uri=uri, status=status, code=code)
        if code in _TRANSIENT or (status is not None and status >= 500):
            return TransientStorageError("server error", uri=uri, status=status, code=code)
        return StorageError("request failed", uri=uri, status=status, code=code)
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AccessDenied("no usable AWS credentials found", uri=uri)
    if isinstance(exc, NoRegionError | ParamValidationError):
        return ConfigError(f"invalid S3 request ({type(exc).__name__}) for {redact_uri(uri)}")
    if isinstance(exc, _CONNECTION_ERRORS):
        endpoint = _endpoint_of(exc)
        hint = f" to {endpoint} (is endpoint_url / AWS_ENDPOINT_URL right?)" if endpoint else ""
        if isinstance(exc, EndpointConnectionError | aiohttp.ClientConnectorError):
            return Unreachable(f"connection failed{hint} ({cause_of(exc)})", uri=uri)
        return error_for_connection(exc, uri, hint)
    if isinstance(exc, OSError):
        return TransientStorageError(f"I/O error ({type(exc).__name__})", uri=uri)
    raise exc


def _endpoint_of(exc: BaseException) -> str | None:
    """The endpoint a connection failure was trying to reach, where the error says it."""
    url = getattr(exc, "kwargs", {}).get("endpoint_url") if hasattr(exc, "kwargs") else None
    if url:
        parts = urlsplit(str(url))  # the endpoint, not the request's path and query
        return redact_uri(f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url))
    host, port = getattr(exc, "host", None), getattr(exc, "port", None)
    return f"{host}:{port}" if host else None


_LOADER: Any = None
_STATIC: Any = None


def _new_session(static_keys: bool = False) -> Any:
    """A session sharing one botocore data loader per process: the loader caches the parsed
    service models, which otherwise cost ~0.2 s of JSON parsing per client.

    Clients given static keys share one session as well (building one registers hundreds of
    handlers, ~10 ms): such a session never resolves credentials, so it holds nothing bound
    to an event loop. Other clients get a fresh session each, since refreshable credentials
    cached in a session carry a lock of the loop that first refreshed them.
    """
    global _LOADER, _STATIC
    if static_keys and _STATIC is not None:
        return _STATIC
    session = get_session()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    if static_keys:
        _STATIC = session
    return session


def _environment_keys() -> dict[str, str]:
    """Keys in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` as static storage options:
    what botocore would resolve first anyway, but known static, so the client shares the
    static-key session (~20 ms saved per client, before the first byte). Not when a profile
    is chosen or the keys expire (botocore refreshes those)."""
    env = os.environ
    if env.get("AWS_PROFILE") or env.get("AWS_CREDENTIAL_EXPIRATION"):
        return {}
    key, secret = env.get("AWS_ACCESS_KEY_ID"), env.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return {}
    out = {"key": key, "secret": secret}
    if env.get("AWS_SESSION_TOKEN"):
        out["token"] = env["AWS_SESSION_TOKEN"]
    return out


class S3Backend:
    """One aiobotocore client, created lazily in the event loop that first uses it.

    Args:
        storage_options: see the module docstring. Unknown keys raise ``ConfigError``.
        max_connections: connection pool size; match it to the request limit.
        connect_timeout_s, read_timeout_s: socket timeouts of one attempt.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        *,
        max_connections: int = 64,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
    ) -> None:
        options = dict(storage_options or {})
        unknown = set(options) - _OPTION_KEYS - {"client_kwargs"}
        if unknown:
            raise ConfigError(
                f"unknown S3 storage_options {sorted(unknown)}; known: {sorted(_OPTION_KEYS)}"
            )
        self._options = options
        self.endpoint_url: str | None = options.get("endpoint_url")
        self._max_connections = max_connections
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._client: Any = None
        self._reads: PresignedReads | None = None
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        # Never the options themselves: they may hold keys.
        return f"S3Backend(endpoint_url={self.endpoint_url!r})"

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await self._create_client()
        return self._client

    async def _create_client(self) -> Any:
        opts = self._options
        if not (opts.get("key") or opts.get("profile") or opts.get("anon")):
            opts = {**opts, **_environment_keys()}
        session = _new_session(static_keys=bool(opts.get("key")) and not opts.get("profile"))
        if opts.get("profile"):
            session.set_config_variable("profile", opts["profile"])
        config_kwargs: dict[str, Any] = {
            "max_pool_connections": self._max_connections,
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "connect_timeout": self._timeouts[0],
            "read_timeout": self._timeouts[1],
        }
        # Presigned URLs signed as every other request is (botocore presigns with SigV2 by
        # default, which regions opened since 2014 refuse).
        config_kwargs["signature_version"] = UNSIGNED if opts.get("anon") else "s3v4"
        if self.endpoint_url:
            config_kwargs["s3"] = {"addressing_style": "path"}
        client_kwargs: dict[str, Any] = dict(opts.get("client_kwargs") or {})
        client_kwargs.setdefault("region_name", opts.get("region_name"))
        if self.endpoint_url:
            client_kwargs["endpoint_url"] = self.endpoint_url
        env = os.environ
        endpoint = self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3", env.get("AWS_ENDPOINT_URL"))
        if endpoint and endpoint.startswith("http://"):  # no TLS: no CA bundle to load
            client_kwargs.setdefault("verify", False)  # (~40 ms before the first read)
        if opts.get("key"):
            client_kwargs["aws_access_key_id"] = opts["key"]
            client_kwargs["aws_secret_access_key"] = opts.get("secret")
            client_kwargs["aws_session_token"] = opts.get("token")
        stack = AsyncExitStack()
        client = await stack.enter_async_context(
            session.create_client("s3", config=AioConfig(**config_kwargs), **client_kwargs)
        )
        self._stack = stack
        verify = client_kwargs.get("verify")
        if verify is None:
            verify = session.get_config_variable("ca_bundle")
        http = HTTPBackend(
            max_connections=self._max_connections,
            connect_timeout_s=self._timeouts[0],
            read_timeout_s=self._timeouts[1],
            ssl=_ssl_for(verify),
            trust_env=True,  # proxies from the environment, as botocore takes them
            translate=translate_s3_error,
        )
        self._reads = PresignedReads(presigner(client), http)
        return client

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        bucket, key = split_bucket_key(uri)
        client = await self._get_client()
        if self._reads is not None:
            try:
                answer = await self._reads.get_range(uri, bucket, key, start, stop, version)
            except ZephonError:
                raise
            except Exception as exc:  # presigning: no credentials, a bad parameter...
                raise translate_s3_error(exc, uri) from None
            if answer is not None:
                return answer
        kwargs: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "Range": f"bytes={start}-{stop - 1}",
        }
        if version is not None:
            kwargs["IfMatch"] = version
        try:
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as body:
                data = await body.read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b"", start  # start at or past the end: an empty slice
            raise translate_s3_error(exc, uri) from None
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        if version is not None and resp.get("ETag") not in (None, version):
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange") or "")
        if match and match.group(3) != "*":
            return data, int(match.group(3))
        return data, start + int(resp.get("ContentLength", len(data)))

    async def head(self, uri: str) -> ObjectInfo:
        bucket, key = split_bucket_key(uri)
        client = await self._get_client()
        try:
            resp = await client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        return ObjectInfo(uri, int(resp["ContentLength"]), str(resp["ETag"]))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        bucket, key = split_bucket_key(uri)
        client = await self._get_client()
        try:
            resp = await client.put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        return ObjectInfo(uri, len(data), str(resp["ETag"]))

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        bucket, key_prefix = split_bucket_key(prefix)
        client = await self._get_client()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key_prefix, "MaxKeys": 1000}
        if token:
            kwargs["ContinuationToken"] = token
        try:
            resp = await client.list_objects_v2(**kwargs)
        except Exception as exc:
            raise translate_s3_error(exc, prefix) from None
        infos = [
            ObjectInfo(f"s3://{bucket}/{item['Key']}", int(item["Size"]), str(item["ETag"]))
            for item in resp.get("Contents", ())
            if not item["Key"].endswith("/")
        ]
        next_token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        return infos, next_token

    async def aclose(self) -> None:
        if self._reads is not None:
            reads, self._reads = self._reads, None
            await reads.aclose()
        if self._stack is not None:
            stack, self._stack, self._client = self._stack, None, None
            await stack.aclose()


def _ssl_for(verify: bool | str | None) -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` for botocore's ``verify``: ``False``, a CA bundle's path, or
    botocore's default bundle. Built now, off the first read's path."""
    if verify is False:
        return False
    return ssl.create_default_context(cafile=get_cert_path(verify if verify else True))

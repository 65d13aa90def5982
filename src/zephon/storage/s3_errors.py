"""Translation of S3 failures (botocore's errors, aiohttp's) into Zephon's errors.

botocore is imported by the S3 backend only when it is needed (a listing, a HEAD, a client
for credentials it must resolve): an error can be botocore's only once it is loaded, so this
module looks for its exception types in ``sys.modules`` instead of importing it.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any
from urllib.parse import urlsplit

import aiohttp

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
from zephon.storage.http_status import cause_of, error_for_connection

__all__ = ["translate_s3_error"]

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
_CONNECTION_ERRORS = (
    aiohttp.ClientError,
    ConnectionError,
    TimeoutError,
    asyncio.IncompleteReadError,
)


def translate_s3_error(exc: BaseException, uri: str) -> ZephonError:
    """Map an aiobotocore/aiohttp failure to a Zephon error by error code and HTTP status."""
    botocore: Any = sys.modules.get("botocore.exceptions")
    if botocore is not None:
        translated = _botocore_error(exc, uri, botocore)
        if translated is not None:
            return translated
    connection = _CONNECTION_ERRORS + ((botocore.BotoCoreError,) if botocore else ())
    if isinstance(exc, connection):
        endpoint = _endpoint_of(exc)
        hint = f" to {endpoint} (is endpoint_url / AWS_ENDPOINT_URL right?)" if endpoint else ""
        unreachable: tuple[type[BaseException], ...] = (aiohttp.ClientConnectorError,)
        if botocore is not None:
            unreachable += (botocore.EndpointConnectionError,)
        if isinstance(exc, unreachable):
            return Unreachable(f"connection failed{hint} ({cause_of(exc)})", uri=uri)
        return error_for_connection(exc, uri, hint)
    if isinstance(exc, OSError):
        return TransientStorageError(f"I/O error ({type(exc).__name__})", uri=uri)
    raise exc


def _botocore_error(exc: BaseException, uri: str, botocore: Any) -> ZephonError | None:
    """The Zephon error for one of botocore's own errors; ``None`` for any other."""
    if isinstance(exc, botocore.ClientError):
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
    if isinstance(exc, botocore.NoCredentialsError | botocore.PartialCredentialsError):
        return AccessDenied("no usable AWS credentials found", uri=uri)
    if isinstance(exc, botocore.NoRegionError | botocore.ParamValidationError):
        return ConfigError(f"invalid S3 request ({type(exc).__name__}) for {redact_uri(uri)}")
    return None


def _endpoint_of(exc: BaseException) -> str | None:
    """The endpoint a connection failure was trying to reach, where the error says it."""
    url = getattr(exc, "kwargs", {}).get("endpoint_url") if hasattr(exc, "kwargs") else None
    if url:
        parts = urlsplit(str(url))  # the endpoint, not the request's path and query
        return redact_uri(f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url))
    host, port = getattr(exc, "host", None), getattr(exc, "port", None)
    return f"{host}:{port}" if host else None

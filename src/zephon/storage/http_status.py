"""Reading and translation of plain HTTP answers, shared by the backends that speak raw HTTP
(GCS, HTTP, the Hub)."""

from __future__ import annotations

import re
import sys

import aiohttp

from zephon.errors import (
    AccessDenied,
    NotFound,
    ObjectChanged,
    StorageError,
    Throttled,
    TransientStorageError,
    Unreachable,
)
from zephon.storage import logsecrets

__all__ = [
    "cause_of",
    "error_for_connection",
    "error_for_status",
    "read_body",
    "total_from_content_range",
]

# aiohttp parses responses strictly in Python's development mode (a duplicated ``Server``
# header, as some servers send, is then an error): said in the message, where it applies.
_STRICT = " (aiohttp parses responses strictly under -X dev or PYTHONASYNCIODEBUG=1)"

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


async def read_body(resp: aiohttp.ClientResponse) -> bytes:
    """The whole body of ``resp``, its bytes copied once: the chunks as received, joined
    (one chunk is returned as it is). aiohttp's ``read()`` copies them twice, on the event
    loop: it joins the chunks buffered at each wake-up, then those joins."""
    chunks = [data async for data, _ in resp.content.iter_chunks() if data]
    return b"".join(chunks)


def error_for_status(status: int, uri: str, code: str | None = None) -> StorageError:
    """The Zephon error for a non-success HTTP status."""
    if status in (404, 410):
        return NotFound("no such object", uri=uri, status=status, code=code)
    if status in (401, 403):
        return AccessDenied("access denied", uri=uri, status=status, code=code)
    if status == 412:
        return ObjectChanged("object changed since it was first seen", uri=uri, status=status)
    if status in (429, 503):
        return Throttled("throttled", uri=uri, status=status, code=code)
    if status >= 500 or status == 408:
        return TransientStorageError("server error", uri=uri, status=status, code=code)
    return StorageError("request failed", uri=uri, status=status, code=code)


def total_from_content_range(value: str | None) -> int | None:
    """The total size in a ``Content-Range: bytes a-b/total`` header, if it states one."""
    match = _CONTENT_RANGE.fullmatch(value or "")
    return int(match.group(3)) if match else None


def _inner(exc: BaseException) -> BaseException:
    """The client's own error under an SDK's wrapper (botocore's ``HTTPClientError``)."""
    wrapped = getattr(exc, "kwargs", {}).get("error") if hasattr(exc, "kwargs") else None
    return wrapped if isinstance(wrapped, BaseException) else exc


def cause_of(exc: BaseException) -> str:
    """What went wrong, for a message: the error's type and what it says, credentials
    masked (never its repr: aiohttp's holds the request's signed headers)."""
    exc = _inner(exc)
    if isinstance(exc, aiohttp.ClientResponseError):
        detail = f"{exc.status}, {exc.message}"
    elif isinstance(exc, OSError) and exc.strerror:
        detail = exc.strerror
    else:
        detail = str(exc)
    detail = logsecrets.scrub(" ".join(detail.split()))[:200]
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__


def error_for_connection(exc: BaseException, uri: str, hint: str = "") -> StorageError:
    """The Zephon error for a request that got no usable answer: a response that does not
    parse is not worth retrying; a connection never made is :class:`Unreachable`; the rest
    (resets, timeouts) transient. Each says its cause."""
    inner = _inner(exc)
    if isinstance(inner, aiohttp.ClientResponseError) and isinstance(
        inner.__cause__, aiohttp.http_exceptions.HttpProcessingError
    ):
        strict = _STRICT if sys.flags.dev_mode or aiohttp.helpers.DEBUG else ""
        return StorageError(
            f"the server's response does not parse ({cause_of(inner)}){strict}", uri=uri
        )
    kind = Unreachable if isinstance(inner, aiohttp.ClientConnectorError) else None
    return (kind or TransientStorageError)(f"connection failed{hint} ({cause_of(inner)})", uri=uri)

"""Translation of plain HTTP answers, shared by the backends that speak raw HTTP (GCS, HTTP)."""

from __future__ import annotations

import re

from zephon.errors import (
    AccessDenied,
    NotFound,
    ObjectChanged,
    StorageError,
    Throttled,
    TransientStorageError,
)

__all__ = ["error_for_status", "total_from_content_range"]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")


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

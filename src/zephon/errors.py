"""Zephon's error hierarchy.

Every error Zephon raises on purpose is a :class:`ZephonError`. Storage errors are translated
once, at the backend edge, from status and error codes; they carry the URI (with any credential
material redacted) and never the raw message of the underlying SDK, which may echo secrets.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "AccessDenied",
    "ConfigError",
    "FormatError",
    "NotFound",
    "ObjectChanged",
    "StateMismatch",
    "StorageError",
    "Throttled",
    "TransientStorageError",
    "TruncatedRead",
    "Unreachable",
    "WorkerCrashed",
    "ZephonError",
    "first_error",
    "native_reader_failure",
    "redact_uri",
]

_SECRET_QUERY_KEYS = re.compile(
    r"(signature|credential|token|key|secret|sig|password|auth)", re.IGNORECASE
)


def redact_uri(uri: str) -> str:
    """Return ``uri`` with user info and secret-looking query values replaced by ``***``.

    Presigned URLs (``X-Amz-Signature=...``), ``user:password@host`` and ``?token=...`` are the
    ways a secret can ride inside a URI; all three are masked. Plain paths pass unchanged.
    """
    if "://" not in uri:
        return uri
    parts = urlsplit(uri)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "***@" + netloc.rsplit("@", 1)[1]
    query = parts.query
    if query:
        pairs = []
        for pair in query.split("&"):
            name, sep, _value = pair.partition("=")
            pairs.append(f"{name}=***" if sep and _SECRET_QUERY_KEYS.search(name) else pair)
        query = "&".join(pairs)
    return urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class ZephonError(Exception):
    """Base class of every error Zephon raises deliberately."""


class ConfigError(ZephonError, ValueError):
    """An argument or setting is invalid; the message names the argument and why."""


class StorageError(ZephonError):
    """A storage operation failed.

    Attributes:
        uri: the object or prefix, credentials redacted.
        status: the HTTP status (or ``None`` when the failure was not an HTTP answer).
        code: the service's error code (``NoSuchKey``, ``SlowDown``...) when it gave one.
        dataset: the dataset being read, once a caller that knows it has set it.
    """

    def __init__(
        self,
        message: str,
        *,
        uri: str,
        status: int | None = None,
        code: str | None = None,
        dataset: str | None = None,
    ) -> None:
        self.message = message
        self.uri = redact_uri(uri)
        self.status = status
        self.code = code
        self.dataset = dataset
        super().__init__(message)

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only fields: rebuild through a helper so errors cross process boundaries.
        return (_rebuild, (type(self), self.message, dict(vars(self))))

    def __str__(self) -> str:
        detail = ", ".join(
            part
            for part in (f"status {self.status}" if self.status else "", self.code or "")
            if part
        )
        text = f"{self.message}: {self.uri}" + (f" ({detail})" if detail else "")
        return text + (f" [dataset {self.dataset!r}]" if self.dataset is not None else "")


class NotFound(StorageError):
    """The object, prefix or bucket does not exist (HTTP 404). Not retried."""


class AccessDenied(StorageError):
    """Credentials are missing or not allowed to do this (HTTP 401/403). Not retried."""


class ObjectChanged(StorageError):
    """The object's version (etag, generation, mtime) differs from the one seen at discovery."""


class TransientStorageError(StorageError):
    """A failure worth retrying: timeout, reset, 5xx. Raised to callers only after retries."""


class Unreachable(TransientStorageError):
    """No connection could be made (refused, unknown host, no route). Retried in full only
    once the endpoint has answered before; an endpoint never reached fails within a second
    (a wrong or forgotten ``endpoint_url`` should not cost a retry budget)."""


class Throttled(TransientStorageError):
    """The service asked us to slow down (429, 503 SlowDown). Lowers concurrency, then retried."""


class TruncatedRead(TransientStorageError):
    """A response body was shorter than its range promised. Retried."""


class FormatError(ZephonError):
    """Bytes that do not parse as the declared format.

    The message names the dataset, the shard URI and, where known, the sample index.
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str | None = None,
        uri: str | None = None,
        sample: int | None = None,
    ) -> None:
        self.dataset = dataset
        self.uri = redact_uri(uri) if uri is not None else None
        self.sample = sample
        where = []
        if dataset is not None:
            where.append(f"dataset {dataset!r}")
        if self.uri is not None:
            where.append(f"shard {self.uri}")
        if sample is not None:
            where.append(f"sample {sample}")
        self.message = message
        super().__init__(message + (f" [{', '.join(where)}]" if where else ""))

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.message, dict(vars(self))))


def _rebuild(cls: type[ZephonError], message: str, fields: dict[str, object]) -> ZephonError:
    err = cls.__new__(cls)
    Exception.__init__(err, message)
    err.__dict__.update(fields)
    if isinstance(err, FormatError):
        where = [
            f"dataset {err.dataset!r}" if err.dataset is not None else "",
            f"shard {err.uri}" if err.uri is not None else "",
            f"sample {err.sample}" if err.sample is not None else "",
        ]
        text = ", ".join(w for w in where if w)
        err.args = (message + (f" [{text}]" if text else ""),)
    return err


class StateMismatch(ZephonError):
    """A checkpoint does not belong to this pipeline; the message says what differs."""


class WorkerCrashed(ZephonError):
    """A process-pool worker died (killed, out of memory) while it held work."""


def native_reader_failure(exc: BaseException) -> bool:
    """An error raised by a native (Rust) format reader on bad data: Python errors, a Rust
    panic (pyo3's ``PanicException`` derives from ``BaseException``), or a bare
    ``pyarrow.ArrowException`` from the Arrow C data interface it hands rows through (a
    damaged field name, say). Callers turn it into a :class:`FormatError` naming the shard."""
    if isinstance(exc, ValueError | OSError | IndexError | RuntimeError):
        return True
    if type(exc).__name__ == "PanicException":
        return True
    return any(
        (c.__module__, c.__name__) == ("pyarrow.lib", "ArrowException") for c in type(exc).__mro__
    )


def first_error(group: BaseExceptionGroup[Any]) -> BaseException:
    """The root failure of a task group: the first exception in it that is not a
    cancellation (what a user should see instead of the group)."""
    import asyncio  # here: `import zephon` does not load asyncio (40-60 ms) for its errors

    pending: list[BaseException] = [group]
    while pending:
        exc = pending.pop(0)
        if isinstance(exc, BaseExceptionGroup):
            pending.extend(exc.exceptions)
        elif not isinstance(exc, asyncio.CancelledError):
            return exc
    return group

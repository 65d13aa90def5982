"""Which backend serves which URI scheme."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

from zephon.errors import ConfigError
from zephon.storage import logsecrets
from zephon.storage.base import Backend
from zephon.storage.diskcache import DiskCache
from zephon.storage.managed import ManagedStorage
from zephon.storage.policy import RetryPolicy, StorageLimits
from zephon.storage.uri import scheme_of

__all__ = ["BackendFactory", "open_storage", "register_backend"]

# storage_options and environment variables whose values are credentials (masked in logs)
_SECRET_OPTION = re.compile(r"(?i)key|secret|token|password|credential|connection_string|sas")
_SECRET_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
               "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
               "AZURE_CLIENT_SECRET", "GOOGLE_OAUTH_ACCESS_TOKEN", "HF_TOKEN")  # fmt: skip

BackendFactory = Callable[[dict[str, Any], StorageLimits], Backend]


def _local(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.local import LocalBackend

    if options:
        raise ConfigError(f"local files take no storage_options, got {sorted(options)}")
    return LocalBackend()


def _memory(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.memory import MemoryBackend

    return MemoryBackend(options.get("store"))


def _s3(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.s3 import S3Backend

    return S3Backend(options, max_connections=limits.max_requests)


def _gcs(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.gcs import GCSBackend

    return GCSBackend(options, max_connections=limits.max_requests)


def _azure(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.azure import AzureBackend

    return AzureBackend(options, max_connections=limits.max_requests)


def _http(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.http import HTTPBackend

    return HTTPBackend(options, max_connections=limits.max_requests)


def _hf(options: dict[str, Any], limits: StorageLimits) -> Backend:
    from zephon.storage.hf import HFBackend

    return HFBackend(options, max_connections=limits.max_requests)


_BACKENDS: dict[str, BackendFactory] = {
    "file": _local,
    "memory": _memory,
    "s3": _s3,
    "gs": _gcs,
    "az": _azure,
    "http": _http,
    "https": _http,
    "hf": _hf,
}


def register_backend(scheme: str, factory: BackendFactory) -> None:
    """Serve ``scheme://`` URIs with backends made by ``factory(storage_options, limits)``."""
    _BACKENDS[scheme.lower()] = factory


def open_storage(
    uri: str,
    storage_options: dict[str, Any] | None = None,
    *,
    limits: StorageLimits | None = None,
    retry: RetryPolicy | None = None,
    cache: DiskCache | None = None,
) -> ManagedStorage:
    """A :class:`ManagedStorage` for the scheme of ``uri`` (``s3://``, ``gs://``, a path...).

    Imports only the SDK that scheme needs. Use it as ``async with open_storage(uri) as st:``
    or call ``await st.aclose()``.

    Raises:
        ConfigError: an unknown scheme or invalid ``storage_options``.
    """
    scheme = scheme_of(uri)
    try:
        factory = _BACKENDS[scheme]
    except KeyError:
        raise ConfigError(
            f"no storage backend for scheme {scheme!r} (known: {sorted(_BACKENDS)})"
        ) from None
    limits = limits or StorageLimits()
    options = dict(storage_options or {})
    if scheme not in ("file", "memory"):
        logsecrets.install()
        logsecrets.register(*(v for k, v in options.items() if _SECRET_OPTION.search(k)))
        logsecrets.register(*(os.environ.get(name) for name in _SECRET_ENV))
    backend = factory(options, limits)
    return ManagedStorage(backend, limits=limits, retry=retry, cache=cache)

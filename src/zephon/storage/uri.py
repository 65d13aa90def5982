"""Splitting storage URIs."""

from __future__ import annotations

from zephon.errors import ConfigError

__all__ = ["canonical", "scheme_of", "split_bucket_key"]


_ALIASES = {"gcs": "gs", "abfs": "az", "abfss": "az", "azure": "az"}


def scheme_of(uri: str) -> str:
    """``s3``, ``gs``, ``az``, ``http``... or ``file`` for plain paths. Other spellings of
    the same store are folded: ``gcs`` into ``gs``; ``abfs``, ``abfss``, ``azure`` into ``az``."""
    head, sep, _ = uri.partition("://")
    if not sep:
        return "file"
    scheme = head.lower()
    return _ALIASES.get(scheme, scheme)


def canonical(uri: str) -> str:
    """The URI as listings spell it: ``gcs://`` becomes ``gs://``, ``abfs://`` ``az://``."""
    head, sep, rest = uri.partition("://")
    alias = _ALIASES.get(head.lower()) if sep else None
    return f"{alias}://{rest}" if alias else uri


def split_bucket_key(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``. Raises ``ConfigError`` without a bucket."""
    _, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"not a bucket URI: {uri!r}")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError(f"URI names no bucket: {uri!r}")
    return bucket, key

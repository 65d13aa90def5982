"""Splitting storage URIs."""

from __future__ import annotations

from zephon.errors import ConfigError

__all__ = ["canonical", "scheme_of", "split_bucket_key"]


def scheme_of(uri: str) -> str:
    """``s3``, ``gs``, ``http``... or ``file`` for plain paths. ``gcs`` is folded into ``gs``."""
    head, sep, _ = uri.partition("://")
    if not sep:
        return "file"
    scheme = head.lower()
    return "gs" if scheme == "gcs" else scheme


def canonical(uri: str) -> str:
    """The URI as listings spell it: ``gcs://`` becomes ``gs://`` (both name GCS)."""
    head, sep, rest = uri.partition("://")
    return f"gs://{rest}" if sep and head.lower() == "gcs" else uri


def split_bucket_key(uri: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``. Raises ``ConfigError`` without a bucket."""
    _, sep, rest = uri.partition("://")
    if not sep:
        raise ConfigError(f"not a bucket URI: {uri!r}")
    bucket, _, key = rest.partition("/")
    if not bucket:
        raise ConfigError(f"URI names no bucket: {uri!r}")
    return bucket, key

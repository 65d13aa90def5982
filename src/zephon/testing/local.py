"""``local_s3``: a real S3 server on this machine for a few lines of code, so an example that
reads ``s3://bucket/...`` runs as printed, with no cloud account (moto's server; install it
with ``pip install 'zephon[demo]'``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from zephon.testing.servers import MotoServer

__all__ = ["local_s3"]


@contextlib.contextmanager
def local_s3(
    bucket: str = "bucket",
    files: Mapping[str, bytes | str] | None = None,
    *,
    upload: str | os.PathLike[str] | None = None,
    prefix: str = "",
) -> Iterator[dict[str, Any]]:
    """A local S3 server holding ``bucket``, for as long as the ``with`` block runs; yields
    the ``storage_options`` that reach it (``endpoint_url``, test keys).

    Args:
        bucket: the bucket to create.
        files: ``{key: content}`` to put in it first (``str`` is written as UTF-8).
        upload: a local directory whose files are put under ``prefix`` (paths kept).
        prefix: where ``upload`` goes in the bucket, e.g. ``"web/"``.

    Example::

        with local_s3("bucket", {"web/part-0.jsonl": '{"text": "hi"}\\n'}) as options:
            web = Dataset.from_path("web", "s3://bucket/web/", storage_options=options)
    """
    with MotoServer() as endpoint:
        endpoint.create_bucket(bucket)
        client = endpoint.client()
        for key, body in (files or {}).items():
            data = body.encode() if isinstance(body, str) else body
            client.put_object(Bucket=bucket, Key=key, Body=data)
        if upload is not None:
            root = Path(upload)
            for path in sorted(p for p in root.rglob("*") if p.is_file()):
                key = prefix + path.relative_to(root).as_posix()
                client.put_object(Bucket=bucket, Key=key, Body=path.read_bytes())
        yield endpoint.storage_options()

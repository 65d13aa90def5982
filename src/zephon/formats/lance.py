"""Lance datasets (``pylance``, the ``lance`` extra): fragments are shards, rows are samples.
A codec that reads by itself.

Discovery reads the dataset's manifest only (fragments and their row counts) and pins its
version, so a checkpoint resumes on the same snapshot however the dataset grows. Rows are
read by Lance's own reader (ranged reads of the selected columns, not downloads): each chunk
takes the rows it needs from each fragment, off the event loop.

Zephon's ``storage_options`` are translated for Lance's object store (``endpoint_url``,
``key``, ``secret``, ``region_name``, ``anon`` for S3; ``account_name``/``account_key`` for
Azure); any other key is passed through as Lance spells it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from zephon.errors import ConfigError, FormatError, NotFound, native_reader_failure
from zephon.formats.blob import Blob
from zephon.formats.codec import BaseCodec
from zephon.formats.index import FragmentIndex
from zephon.refs import ShardInfo

__all__ = ["LanceCodec", "is_lance_path", "lance_options", "lance_shards"]

_S3_KEYS = {"endpoint_url": "aws_endpoint", "key": "aws_access_key_id",
            "secret": "aws_secret_access_key", "region_name": "aws_region",
            "token": "aws_session_token"}  # fmt: skip


def is_lance_path(path: str) -> bool:
    return path.rstrip("/").endswith(".lance")


def lance_options(uri: str, options: dict[str, Any]) -> dict[str, str]:
    """Zephon's storage_options as Lance's object store reads them."""
    out: dict[str, str] = {}
    for key, value in options.items():
        if key == "anon":
            if value:
                out["aws_skip_signature"] = "true"
        elif key in _S3_KEYS and uri.startswith("s3://"):
            out[_S3_KEYS[key]] = str(value)
        elif value is not None:
            out[key] = str(value)
    if out.get("aws_endpoint", "").startswith("http://"):
        out["allow_http"] = "true"
    return out


def _lance() -> Any:
    try:
        import lance
    except ImportError:
        raise ConfigError("Lance datasets need pylance: pip install 'zephon[lance]'") from None
    return lance


def _open(uri: str, options: dict[str, Any], version: int | None, name: str) -> Any:
    lance = _lance()
    try:
        return lance.dataset(uri, version=version, storage_options=lance_options(uri, options))
    except BaseException as exc:
        if not native_reader_failure(exc):
            raise
        text = str(exc)
        if "not found" in text.lower() or "does not exist" in text.lower():
            raise NotFound(f"no Lance dataset ({text[:200]})", uri=uri) from None
        raise FormatError(
            f"cannot open the Lance dataset: {text[:300]}", dataset=name, uri=uri
        ) from None


async def lance_shards(
    name: str, path: str, options: dict[str, Any], columns: Sequence[str] | None
) -> tuple[str, list[ShardInfo], list[FragmentIndex], LanceCodec, dict[str, Any]]:
    """``(root, shards, indexes, codec, meta)`` of the Lance dataset at ``path``, from its
    manifest: a shard per fragment, pinned to the version read."""
    uri = path.rstrip("/")

    def read_manifest() -> tuple[int, list[tuple[int, int, int]], list[str]]:
        ds = _open(uri, options, None, name)
        try:  # a damaged manifest can fail (or panic) here, past opening
            fields = list(ds.schema.names)
            frags = []
            for fragment in ds.get_fragments():
                size = sum(
                    int(getattr(f, "file_size_bytes", None) or 0) for f in fragment.data_files()
                )
                frags.append((fragment.fragment_id, fragment.count_rows(), size))
            return int(ds.version), frags, fields
        except BaseException as exc:
            if not native_reader_failure(exc):
                raise
            raise FormatError(
                f"cannot read the Lance manifest: {str(exc)[:300]}", dataset=name, uri=uri
            ) from None

    version, frags, fields = await asyncio.to_thread(read_manifest)
    if columns is not None:
        missing = [c for c in columns if c not in fields]
        if missing:
            raise ConfigError(f"dataset {name!r}: no columns {missing} in {uri} (it has {fields})")
    root = uri + "/"
    shards = [ShardInfo(f"{root}#fragment={fid}", n, size, str(version)) for fid, n, size in frags]
    indexes = [FragmentIndex(n, size / n if n and size else 1.0) for _, n, size in frags]
    codec = LanceCodec(name, uri, options, version, list(columns) if columns else None)
    return root, shards, indexes, codec, {"version": version}


class LanceCodec(BaseCodec):
    """Rows of a Lance fragment as ``{column: value}`` dicts, read by Lance itself."""

    format = "lance"
    reads_itself = True  # no bytes come through Zephon's fetch: decode does the reading

    def __init__(
        self,
        dataset: str,
        uri: str,
        options: dict[str, Any],
        version: int,
        columns: list[str] | None,
    ) -> None:
        self.dataset = dataset
        self.uri = uri
        self.options = dict(options)
        self.version = version
        self.columns = columns
        self._handle: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_handle"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._handle = None

    def __repr__(self) -> str:
        return f"LanceCodec({self.uri!r}, version={self.version})"

    def decode(
        self, shard: ShardInfo, index: FragmentIndex, blob: Blob, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        if self._handle is None:
            self._handle = _open(self.uri, self.options, self.version, self.dataset)
        fid = int(shard.uri.rsplit("#fragment=", 1)[1])
        try:
            fragment = self._handle.get_fragment(fid)
            # Lance takes strictly increasing rows: read each once, in order, then place them.
            wanted, where = np.unique(np.asarray(samples, dtype=np.int64), return_inverse=True)
            table = fragment.take(wanted.tolist(), columns=self.columns)
        except BaseException as exc:
            if not native_reader_failure(exc):
                raise
            raise FormatError(
                f"cannot read Lance rows ({exc})", dataset=self.dataset, uri=shard.uri
            ) from None
        rows: list[dict[str, Any]] = table.to_pylist()
        return [rows[i] for i in where.tolist()]

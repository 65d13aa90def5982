"""Value types shared by every layer. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ObjectInfo", "ShardInfo"]


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a storage ``stat`` or ``list`` knows of one object.

    Attributes:
        uri: full location (``s3://bucket/key``, ``gs://...``, a local path, ``http(s)://...``).
        size_bytes: object length.
        version: opaque version token (S3 etag, GCS generation, local mtime+size, HTTP etag);
            reads pinned to it fail with ``ObjectChanged`` once the object is replaced.
    """

    uri: str
    size_bytes: int
    version: str


@dataclass(frozen=True, slots=True)
class ShardInfo:
    """One shard of a dataset as discovery saw it.

    Attributes:
        uri: full location of the shard file.
        num_samples: samples in the shard.
        size_bytes: shard length in bytes.
        version: the etag, generation or mtime seen at discovery; reads are pinned to it.
    """

    uri: str
    num_samples: int
    size_bytes: int
    version: str

"""Value types shared by every layer. Standard library only."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from zephon.errors import redact_uri

if TYPE_CHECKING:  # annotations only: `import zephon` does not load numpy
    import numpy as np

__all__ = ["Cursor", "ObjectInfo", "RangeRequest", "ShardInfo", "path_of"]


def path_of(uri: str) -> str:
    """``uri`` without the query and fragment of an ``http(s)`` URL (a presigned URL's
    signature, say): what names the object, for its extension, folder and identity."""
    if uri[:8].lower().startswith(("http://", "https://")):
        return uri.split("#", 1)[0].split("?", 1)[0]
    return uri


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

    def __repr__(self) -> str:
        return (
            f"ObjectInfo(uri={redact_uri(self.uri)!r}, size_bytes={self.size_bytes}, "
            f"version={self.version!r})"
        )


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

    def __repr__(self) -> str:  # a presigned URL's signature, a password: never printed
        return (
            f"ShardInfo(uri={redact_uri(self.uri)!r}, num_samples={self.num_samples}, "
            f"size_bytes={self.size_bytes}, version={self.version!r})"
        )


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a work chunk starts in one lane's curriculum: enough to plan it again.

    Attributes:
        lane: the lane (logical stream).
        chunk: index of the work chunk within the lane.
        position: pointers of the lane before this chunk.
        counts: per dataset, pointers drawn before this chunk.
        tokens: per dataset, estimated tokens drawn before this chunk (token mixtures only).
        base, base_tokens: the draws (and tokens) at the start of the mixture segment the
            chunk starts in: a schedule's phase, or what is left after a dataset left the
            mixture (:mod:`zephon.plan.lanemix`); ``None``: the lane's start.
    """

    lane: int
    chunk: int
    position: int
    counts: tuple[int, ...]
    tokens: tuple[float, ...] | None = None
    base: tuple[int, ...] | None = None
    base_tokens: tuple[float, ...] | None = None

    def __repr__(self) -> str:  # the segment's base only where there is one
        base = "" if self.base is None else f", base={self.base}, base_tokens={self.base_tokens}"
        return (
            f"Cursor(lane={self.lane}, chunk={self.chunk}, position={self.position}, "
            f"counts={self.counts}, tokens={self.tokens}{base})"
        )

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {
            "lane": self.lane,
            "chunk": self.chunk,
            "position": self.position,
            "counts": list(self.counts),
        }
        if self.tokens is not None:
            out["tokens"] = list(self.tokens)
        if self.base is not None:
            out["base"] = list(self.base)
        if self.base_tokens is not None:
            out["base_tokens"] = list(self.base_tokens)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Cursor:
        tokens = data.get("tokens")
        base, base_tokens = data.get("base"), data.get("base_tokens")
        return cls(
            int(data["lane"]),  # type: ignore[call-overload]
            int(data["chunk"]),  # type: ignore[call-overload]
            int(data["position"]),  # type: ignore[call-overload]
            tuple(int(c) for c in data["counts"]),  # type: ignore[attr-defined]
            tuple(float(t) for t in tokens) if tokens is not None else None,  # type: ignore[attr-defined]
            tuple(int(c) for c in base) if base is not None else None,  # type: ignore[attr-defined]
            tuple(float(t) for t in base_tokens) if base_tokens is not None else None,  # type: ignore[attr-defined]
        )


class RangeRequest(NamedTuple):
    """Bytes to fetch from one shard and the samples they hold.

    A named tuple rather than a dataclass: the planner makes one per request on its hot path.

    Attributes:
        dataset: index of the dataset in the work source's list.
        shard: index of the shard in the dataset.
        uri, version: the shard's location and the version to pin reads to.
        ranges: byte ranges ``(start, stop)`` to fetch, coalesced.
        samples: sample indices within the shard, in curriculum order (an int64 array, a
            view of the planner's columns: no per-sample objects on the hot path).
        slots: the position of each sample within its work chunk (int64 array, ascending).
        cursor: the work chunk's cursor.
        chunk_length: pointers in the work chunk (its requests' slots cover ``range(length)``).
        passes: per sample, the pass of its dataset it was drawn in (0, 1, ...: a dataset
            read again, by ``stop_after_passes`` or a repeat, is in its next pass); ``None``
            means all 0.
    """

    dataset: int
    shard: int
    uri: str
    version: str
    ranges: tuple[tuple[int, int], ...]
    samples: np.ndarray
    slots: np.ndarray
    cursor: Cursor
    chunk_length: int
    passes: np.ndarray | None = None

    @property
    def nbytes(self) -> int:
        return sum(stop - start for start, stop in self.ranges)

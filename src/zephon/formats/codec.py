"""The codec: what a format gives the rest of Zephon, and nothing else.

A dataset's codec turns the bytes of a shard's read (a :class:`~zephon.formats.blob.Blob`)
into samples; discovery builds each shard's index (:mod:`zephon.formats.index`) and the
planner plans reads from it. Every codec implements :class:`Codec`; :class:`BaseCodec`
gives the defaults, so a codec states only what differs. Codecs pickle (to reach worker
processes) as their configuration, never as open files or sessions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from zephon.formats.blob import Blob
from zephon.refs import ShardInfo

__all__ = ["BaseCodec", "Codec"]


@runtime_checkable
class Codec(Protocol):
    """What the pipeline and discovery ask of a format.

    Attributes:
        format: the format's name (``"jsonl"``, ``"parquet"``...).
        dataset: the dataset's name, for errors.
        reads_itself: ``decode`` reads the shard itself (through Zephon's storage, e.g.
            Vortex, Lance): no bytes come through the fetch stage, and decoding runs off
            the event loop.
        releases_gil: ``decode`` spends its time in native code that releases the GIL
            (Arrow's Parquet reader): a large read (``pipeline.graph.OFF_LOOP_BYTES``) is
            decoded on a thread, and the event loop keeps receiving the next reads
            meanwhile. Pure-Python decoders gain nothing from a thread (they hold the GIL)
            and stay on the loop, as do small reads (the hand-off costs more than it frees).
        takes_arrays: ``decode`` accepts ``samples`` as an int64 numpy array (picking rows
            is numpy work), not only a sequence of ints.
    """

    format: str
    dataset: str
    reads_itself: bool
    releases_gil: bool
    takes_arrays: bool

    def decode(self, shard: ShardInfo, index: Any, blob: Blob, samples: Sequence[int]) -> list[Any]:
        """Samples ``samples`` (indices in the shard, in order, repeats allowed) of ``shard``
        from ``blob``, the bytes its index says they lie in. Raises ``FormatError`` naming
        the dataset, shard and sample for bad bytes."""
        ...

    def use_disk_cache(self, cache: Any) -> None:
        """Keep what is expensive to redo (a shard decompressed as a whole) in ``cache`` (a
        :class:`~zephon.storage.DiskCache`) as well as in memory."""
        ...

    def bind_storage(self, options: dict[str, Any]) -> None:
        """The storage options to read with, for a codec that reads by itself."""
        ...


class BaseCodec:
    """The defaults of :class:`Codec`: fed its bytes, one sample index at a time, nothing
    to cache, no storage of its own."""

    format: str
    dataset: str
    reads_itself: bool = False
    releases_gil: bool = False
    takes_arrays: bool = False

    def decode(self, shard: ShardInfo, index: Any, blob: Blob, samples: Sequence[int]) -> list[Any]:
        raise NotImplementedError

    def use_disk_cache(self, cache: Any) -> None:
        return None

    def bind_storage(self, options: dict[str, Any]) -> None:
        return None

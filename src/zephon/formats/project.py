"""Column projection for formats whose samples are whole records (JSONL, MDS, LitData,
WebDataset): the record is decoded, then only the requested fields are kept. (Parquet projects
natively: unrequested column chunks are never fetched.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from zephon.errors import FormatError
from zephon.formats.codec import BaseCodec, Codec
from zephon.refs import ShardInfo

__all__ = ["ProjectedCodec"]


class ProjectedCodec(BaseCodec):
    """``codec``'s samples with only ``columns`` kept. A sample that lacks one of them is a
    :class:`FormatError` naming it (a silently missing field would surface much later)."""

    def __init__(self, codec: Codec, columns: Sequence[str]) -> None:
        self.codec = codec
        self.columns = list(columns)
        self.format = codec.format
        self.dataset = codec.dataset
        self.reads_itself = codec.reads_itself
        self.releases_gil = codec.releases_gil

    def decode(
        self, shard: ShardInfo, index: Any, blob: Any, samples: Sequence[int]
    ) -> list[dict[str, Any]]:
        rows = self.codec.decode(shard, index, blob, samples)
        columns = self.columns
        try:
            return [{c: row[c] for c in columns} for row in rows]
        except KeyError:
            for i, row in zip(samples, rows, strict=True):
                missing = [c for c in columns if c not in row]
                if missing:
                    raise FormatError(
                        f"sample lacks columns {missing} (has {sorted(row)})",
                        dataset=self.dataset,
                        uri=shard.uri,
                        sample=int(i),
                    ) from None
            raise

    def use_disk_cache(self, cache: Any) -> None:
        self.codec.use_disk_cache(cache)

    def bind_storage(self, options: dict[str, Any]) -> None:
        self.codec.bind_storage(options)

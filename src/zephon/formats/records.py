"""Shared helpers of the two "header + offsets + samples" shard layouts (MDS, LitData).

Both begin with ``uint32 n`` and ``uint32 offsets[n + 1]`` (absolute offsets in the shard), so
the header of a shard with ``n`` samples is exactly ``4 * (n + 2)`` bytes: one range read.
"""

from __future__ import annotations

import numpy as np

from zephon.formats.index import RecordIndex

__all__ = ["header_bytes", "parse_offsets_header"]


def header_bytes(num_samples: int) -> int:
    return 4 * (num_samples + 2)


def parse_offsets_header(data: bytes, num_samples: int, shard_size: int) -> RecordIndex:
    """The :class:`RecordIndex` of a shard from its first ``header_bytes(n)`` bytes.

    Raises ``ValueError`` if the header disagrees with the index file or the shard's size.
    """
    if len(data) < header_bytes(num_samples):
        raise ValueError(f"header is {len(data)} bytes, expected {header_bytes(num_samples)}")
    (n,) = np.frombuffer(data, np.uint32, 1)
    if int(n) != num_samples:
        raise ValueError(f"shard header says {int(n)} samples, the index says {num_samples}")
    offsets = np.frombuffer(data, np.uint32, num_samples + 1, 4).astype(np.int64)
    if num_samples and (np.any(np.diff(offsets) < 0) or offsets[-1] > shard_size):
        raise ValueError("sample offsets in the shard header are out of order or past its end")
    return RecordIndex(offsets)

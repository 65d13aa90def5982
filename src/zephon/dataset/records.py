"""In-memory records as a dataset: JSONL shards in the process-local memory store
(:meth:`zephon.Dataset.from_records`)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from zephon.errors import ConfigError

__all__ = ["put_records"]


def put_records(name: str, records: Iterable[Mapping[str, Any]], per_shard: int, store: Any) -> str:
    """Records (JSON-serialisable dicts) as JSONL shards of ``per_shard`` in a memory
    ``store``; returns their prefix. The prefix is a digest of the content: the same records
    give the same dataset in any process, so checkpoints of it restore there.

    Raises:
        ConfigError: ``per_shard`` < 1, or a record that is not JSON (naming it).
    """
    if per_shard < 1:
        raise ConfigError(f"samples_per_shard must be >= 1, got {per_shard}")
    shards: list[bytes] = []
    lines: list[bytes] = []
    i = 0
    try:
        for i, record in enumerate(records):  # noqa: B007  (i names the bad record)
            lines.append(json.dumps(record, separators=(",", ":")).encode() + b"\n")
            if len(lines) == per_shard:
                shards.append(b"".join(lines))
                lines = []
    except TypeError as exc:
        raise ConfigError(f"record {i} of dataset {name!r} is not JSON: {exc}") from None
    if lines or not shards:
        shards.append(b"".join(lines))
    digest = hashlib.sha256(b"".join(hashlib.sha256(x).digest() for x in shards))
    prefix = f"memory://zephon-records/{name}-{digest.hexdigest()[:12]}/"
    for shard, data in enumerate(shards):
        store.put(f"{prefix}shard-{shard:06d}.jsonl", data)
    return prefix

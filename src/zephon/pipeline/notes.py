"""Error notes in the user's terms: the samples a failed step was given, by dataset name and
shard URI. A step's note is written where it ran (a worker process knows datasets and
shards only by number); the pipeline names them when the error reaches the consumer."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from zephon.errors import redact_uri

__all__ = ["named"]

_REF = re.compile(r"dataset #(\d+), shard (\d+)")


def named(exc: BaseException, datasets: Sequence[Any]) -> None:
    """Rewrite ``exc``'s notes' ``dataset #i, shard j`` as the dataset's name and the shard's
    URI (secrets redacted)."""
    notes = getattr(exc, "__notes__", None)
    if not notes:
        return

    def name(match: re.Match[str]) -> str:
        d, s = int(match.group(1)), int(match.group(2))
        if d >= len(datasets) or s >= len(datasets[d].shards):
            return match.group(0)
        uri = redact_uri(datasets[d].shards[s].uri)
        return f"dataset {datasets[d].name!r}, shard {uri!r}"

    exc.__notes__ = [_REF.sub(name, n) if isinstance(n, str) else n for n in notes]

"""``where=``: the samples whose columns satisfy a predicate, found once at discovery.

The predicate is a ``pyarrow.compute`` expression (``pc.field("score") > 0.5``). The columns
it names are read once, alone where the format reads columns apart (Parquet, Lance), the
expression evaluated shard by shard, and the rows it rejects kept as an exclusion
(:mod:`zephon.dataset.selection`). The rejected rows of each shard are cached on local disk,
keyed by the shard's URI and version and the expression: a rewritten shard is read again,
an unchanged one never.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from zephon.errors import ConfigError

__all__ = ["referenced", "rejected_rows"]

_ROW = "__zephon_row__"


def referenced(expression: Any, names: Sequence[str]) -> list[str]:
    """The columns of ``names`` the expression mentions (by name in its text: a name that
    only appears in a string literal costs one more column read, nothing else)."""
    text = str(expression)
    return [n for n in names if re.search(rf"(?<![\w.]){re.escape(n)}(?![\w])", text)]


def check(expression: Any) -> None:
    import pyarrow.compute as pc

    if not isinstance(expression, pc.Expression):
        raise ConfigError(
            f"where must be a pyarrow.compute expression such as pc.field('score') > 0.5, got "
            f"{type(expression).__name__}"
        )


def _cache_file(cache: Path | None, uri: str, version: str, expression: Any) -> Path | None:
    if cache is None:
        return None
    key = hashlib.sha256(f"{uri}\0{version}\0{expression}".encode()).hexdigest()[:32]
    return cache / "where" / f"{key}.npy"


def rejected_in(rows: list[dict[str, Any]], expression: Any, where: str) -> np.ndarray:
    """Indices of ``rows`` the expression rejects (false or null)."""
    import pyarrow as pa

    table = pa.Table.from_pylist(rows) if rows else pa.table({})
    table = table.append_column(_ROW, pa.array(np.arange(len(rows), dtype=np.int64)))
    try:
        kept = table.filter(expression).column(_ROW).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, KeyError) as exc:
        raise ConfigError(f"where {expression} cannot be evaluated on {where}: {exc}") from None
    return np.setdiff1d(np.arange(len(rows), dtype=np.int64), kept)


async def rejected_rows(
    projected: Any, expression: Any, cache: Path | None
) -> dict[int, np.ndarray]:
    """Per shard of the ``projected`` dataset (only the expression's columns), the rows it
    rejects; read a few row groups at a time, cached per shard version."""
    out: dict[int, np.ndarray] = {}
    async with projected.open_storage() as storage:
        for shard, info in enumerate(projected.shards):
            path = _cache_file(cache, info.uri, info.version, expression)
            if path is not None and path.exists():
                try:
                    out[shard] = np.load(path, allow_pickle=False)
                    continue
                except (OSError, ValueError):
                    pass  # a damaged cache entry: read the shard again
            rows: list[dict[str, Any]] = []
            step = 4096
            for a in range(0, info.num_samples, step):
                b = min(info.num_samples, a + step)
                rows += await projected.aread(storage, shard, range(a, b))
            gone = rejected_in(rows, expression, f"shard {info.uri!r} of {projected.name!r}")
            out[shard] = gone
            if path is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp.npy")
                np.save(tmp, gone, allow_pickle=False)
                tmp.replace(path)
    return out

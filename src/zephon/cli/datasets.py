"""``zephon inspect`` and ``zephon index``."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from zephon.choices import DatasetFormat
from zephon.dataset import Dataset
from zephon.errors import ZephonError


def _preview(value: Any, limit: int = 120) -> str:
    if isinstance(value, dict):  # whole fields, as many as fit
        parts: list[str] = []
        for k, v in value.items():
            part = f"{k!r}: {_preview(v, 40)}"
            if parts and sum(len(p) + 2 for p in parts) + len(part) > limit:
                return "{" + ", ".join(parts) + f", ... (+{len(value) - len(parts)} fields)}}"
            parts.append(part)
        return "{" + ", ".join(parts) + "}"
    elif isinstance(value, bytes | bytearray):
        text = f"<{len(value)} bytes>"
    elif getattr(value, "shape", ()) != () and hasattr(value, "dtype"):
        text = f"<array {value.dtype} {tuple(value.shape)}>"
    elif isinstance(value, str) and len(value) > limit:
        keep = max(1, limit - 12)  # a cut string still reads as a string: quotes kept
        return repr(value[:keep])[:-1] + f"...' (+{len(value) - keep})"
    else:
        text = repr(value)
    if len(text) <= limit:
        return text
    return text[: limit - 3] + "..."


def _name(path: str) -> str:
    """A dataset name for errors: the last part of the path."""
    return path.rstrip("/").rsplit("/", 1)[-1] or path


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError


async def _inspect(
    path: str,
    fmt: DatasetFormat | None,
    options: dict[str, Any],
    allow_pickle: bool,
    n: int,
    shards: int,
) -> None:
    ds = await Dataset.afrom_path(
        _name(path), path, format=fmt, storage_options=options, allow_pickle=allow_pickle
    )
    st = ds.discovery_stats
    total = sum(s.size_bytes for s in ds.shards)
    print(f"path      {path}")
    print(f"format    {ds.format}")
    print(f"shards    {len(ds.shards)}  ({_size(total)})")
    print(f"samples   {ds.num_samples}")
    print(
        f"discovery {st.requests} requests, {_size(st.bytes_read)} read in {st.seconds:.2f}s "
        f"({st.indexed} indexed, {st.cache_hits} from cache, {st.from_persistent_index} from "
        "persistent index)"
    )
    for info in ds.shards[:shards]:
        print(f"  {info.uri}  {info.num_samples} samples  {_size(info.size_bytes)}")
    if len(ds.shards) > shards:
        print(f"  ... {len(ds.shards) - shards} more")
    for i, sample in enumerate(await ds.ahead(n)):
        print(f"[{i}] {_preview(sample)}")


def run_inspect(
    path: str,
    fmt: DatasetFormat | None,
    options: dict[str, Any],
    allow_pickle: bool,
    n: int,
    shards: int,
) -> int:
    try:
        asyncio.run(_inspect(path, fmt, options, allow_pickle, n, shards))
    except ZephonError as exc:
        print(f"zephon inspect: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0


async def _index(
    path: str,
    fmt: DatasetFormat | None,
    options: dict[str, Any],
    allow_pickle: bool,
    out: str | None,
) -> str:
    ds = await Dataset.afrom_path(
        _name(path), path, format=fmt, storage_options=options, allow_pickle=allow_pickle
    )
    target = await ds.awrite_index(out)
    print(f"indexed {len(ds.shards)} {ds.format} shards, {ds.num_samples} samples -> {target}")
    return target


def run_index(
    path: str,
    fmt: DatasetFormat | None,
    options: dict[str, Any],
    allow_pickle: bool,
    out: str | None,
) -> int:
    try:
        asyncio.run(_index(path, fmt, options, allow_pickle, out))
    except ZephonError as exc:
        print(f"zephon index: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    return 0

"""Discovery: from a path to a :class:`~zephon.dataset.core.Dataset`, reading metadata only.

Requests grow with the number of shards (a listing page per thousand objects, a footer or
header per shard), never with samples; the exceptions are formats with no random-access
metadata (plain JSONL, tar), scanned once and then served from the local index cache or a
persistent index. Shards are processed concurrently, bounded by the storage limits.
"""

from __future__ import annotations

import asyncio
import functools
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from zephon.choices import DatasetFormat, choices
from zephon.dataset.builders import SCAN_INFLIGHT_BYTES, build_records
from zephon.dataset.cache import PERSISTENT_INDEX_NAME, IndexCache, PersistentIndex
from zephon.dataset.locate import locate, read_whole
from zephon.dataset.names import basename as _basename
from zephon.dataset.names import format_of, is_jsonl_by_name, natural_key
from zephon.dataset.names import not_a_shard as _hidden
from zephon.dataset.registry import FORMATS as FORMATS_BY_NAME
from zephon.dataset.registry import SHARD_FORMATS
from zephon.errors import ConfigError, FormatError, NotFound, StorageError, redact_uri
from zephon.formats.codec import Codec
from zephon.formats.index import FragmentIndex, RecordIndex, RowGroupIndex, StreamIndex, WholeIndex
from zephon.formats.jsondata import parse_json
from zephon.formats.project import ProjectedCodec
from zephon.refs import ObjectInfo, ShardInfo
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate
from zephon.storage.keep import ScanKeep
from zephon.storage.uri import scheme_of

__all__ = [
    "FORMATS",
    "Discovered",
    "DiscoveryStats",
    "discover",
    "discover_lance",
    "format_of",
    "natural_key",
]

FORMATS: tuple[str, ...] = choices(DatasetFormat)
AnyIndex = RecordIndex | RowGroupIndex | StreamIndex | WholeIndex | FragmentIndex
_GLOB = re.compile(r"[*?\[]")
_SHARD_CONCURRENCY = 32


@dataclass
class DiscoveryStats:
    """What discovery cost: requests and bytes, objects listed, shards scanned or cached."""

    requests: int = 0
    bytes_read: int = 0
    listed: int = 0
    indexed: int = 0
    cache_hits: int = 0
    from_persistent_index: int = 0
    seconds: float = 0.0


@dataclass
class Discovered:
    format: str
    root: str
    shards: list[ShardInfo]
    indexes: list[AnyIndex]
    codec: Codec
    format_meta: dict[str, Any]
    stats: DiscoveryStats = field(default_factory=DiscoveryStats)
    keep: ScanKeep | None = None  # what scans read, for the first epoch


@dataclass
class _Context:
    name: str
    storage: ManagedStorage
    cache: IndexCache | None
    columns: list[str] | None
    allow_pickle: bool
    stats: DiscoveryStats
    persistent: PersistentIndex | None = None
    root: str = ""
    keep: ScanKeep | None = None
    by_uri: dict[str, Any] = field(default_factory=dict)
    scan_gate: CapacityGate = field(default_factory=lambda: CapacityGate(SCAN_INFLIGHT_BYTES))


async def _bounded(jobs: Sequence[Callable[[], Awaitable[Any]]]) -> list[Any]:
    sem = asyncio.Semaphore(_SHARD_CONCURRENCY)

    async def run(job: Callable[[], Awaitable[Any]]) -> Any:
        async with sem:
            return await job()

    return list(await asyncio.gather(*(run(j) for j in jobs)))


async def _index_for(
    ctx: _Context, info: ObjectInfo, kind: str, build: Callable[[], Awaitable[AnyIndex]]
) -> AnyIndex:
    entry = ctx.by_uri.get(info.uri)
    if entry is not None and entry.version == info.version and entry.size_bytes == info.size_bytes:
        ctx.stats.from_persistent_index += 1
        return _rebuild_columns(entry.index, info, ctx)
    use_cache = ctx.cache is not None and scheme_of(info.uri) != "memory"
    if use_cache:
        assert ctx.cache is not None
        cached = ctx.cache.get(info.uri, info.version, info.size_bytes, kind)
        if cached is not None:
            ctx.stats.cache_hits += 1
            return _rebuild_columns(cached, info, ctx)
    index = await build()  # all columns: the cached index serves any projection
    ctx.stats.indexed += 1
    if use_cache:
        assert ctx.cache is not None
        ctx.cache.put(info.uri, info.version, info.size_bytes, kind, index)
    return _rebuild_columns(index, info, ctx)


def _rebuild_columns(index: AnyIndex, info: ObjectInfo, ctx: _Context) -> AnyIndex:
    if isinstance(index, RowGroupIndex) and ctx.columns is not None:
        from zephon.formats import parquet as parquet_format

        try:
            return parquet_format.index_from_footer(index.footer, info.size_bytes, ctx.columns)
        except parquet_format.MissingColumns as exc:
            raise ConfigError(f"dataset {ctx.name!r}: {exc} in {redact_uri(info.uri)}") from None
        except ValueError as exc:
            raise FormatError(str(exc), dataset=ctx.name, uri=info.uri) from None
    return index


async def _simple_format(
    ctx: _Context, fmt: str, objects: list[ObjectInfo]
) -> tuple[list[ObjectInfo], list[AnyIndex], Any]:
    shards = sorted(
        (o for o in objects if format_of(o.uri) == fmt and not _hidden(o.uri, ctx.root)),
        key=lambda o: natural_key(o.uri),
    )
    if not shards:
        raise FormatError(f"no {fmt} shards found", dataset=ctx.name, uri=ctx.root)
    found = SHARD_FORMATS[fmt]
    assert found.index is not None and found.codec is not None
    build = found.index
    indexes = await _bounded(
        [
            functools.partial(_index_for, ctx, i, fmt, functools.partial(build, ctx, i))
            for i in shards
        ]
    )
    codec = found.codec(ctx)
    return shards, indexes, codec


async def _stat_members(
    ctx: _Context, names: Sequence[str], listed: dict[str, ObjectInfo], index_uri: str
) -> list[ObjectInfo]:
    """The shards an index names; one that is not there makes the index wrong for this data
    (a ``FormatError`` naming it), whatever the storage said."""
    uris = [ctx.root + n for n in names]
    missing = [u for u in uris if u not in listed]
    try:
        stats = await asyncio.gather(*(ctx.storage.stat(u) for u in missing))
    except NotFound as exc:
        raise FormatError(
            f"the index names shard {_basename(exc.uri)!r}, which is not there",
            dataset=ctx.name,
            uri=index_uri,
        ) from exc
    found = {**listed, **{i.uri: i for i in stats}}
    return [found[u] for u in uris]


async def _whole_index(count: int, size_bytes: int, raw_bytes: int, codec: str) -> WholeIndex:
    return WholeIndex(count, size_bytes, raw_bytes, codec)


async def _indexed_format(
    ctx: _Context,
    fmt: str,
    index_json: ObjectInfo | None,
    raw: bytes | None,
    objects: list[ObjectInfo],
) -> tuple[list[ObjectInfo], list[AnyIndex], Any, dict[str, Any]]:
    """MDS or LitData: an ``index.json`` names the shards and their sample counts.

    Long because both formats' index checks are here, each naming the shard it rejects."""
    listed = {o.uri: o for o in objects}
    if ctx.persistent is not None and ctx.persistent.format == fmt:
        meta = ctx.persistent.format_meta
        names = [e.path for e in ctx.persistent.entries]
        counts = [e.num_samples for e in ctx.persistent.entries]
    else:
        if index_json is None:
            raise FormatError(f"{fmt} dataset has no index.json", dataset=ctx.name, uri=ctx.root)
        if raw is None:
            raw = await read_whole(ctx.storage, index_json)
        try:
            if fmt == "mds":
                from zephon.formats.mds import parse_mds_index

                specs = parse_mds_index(raw)
                names = [s.basename for s in specs]
                counts = [s.num_samples for s in specs]
                meta = {
                    "columns": {
                        s.basename: [s.column_names, s.column_encodings, s.column_sizes]
                        for s in specs
                    },
                    "compressed": {
                        s.basename: [s.compression, s.raw_bytes] for s in specs if s.compression
                    },
                }
            else:
                from zephon.formats.litdata import parse_litdata_index

                chunks, config = parse_litdata_index(raw)
                names = [c[0] for c in chunks]
                counts = [c[1] for c in chunks]
                meta = {"config": config}
                if config.get("compression"):
                    meta["compressed"] = {c[0]: [config["compression"], c[2]] for c in chunks}
        except ValueError as exc:
            raise FormatError(str(exc), dataset=ctx.name, uri=index_json.uri) from None
    named_by = index_json.uri if index_json is not None else ctx.root + PERSISTENT_INDEX_NAME
    infos = await _stat_members(ctx, names, listed, named_by)
    compressed = meta.get("compressed", {})

    def builder(name: str, info: ObjectInfo, count: int) -> Callable[[], Awaitable[AnyIndex]]:
        if name in compressed:  # read whole when used: nothing to read now
            codec, raw_bytes = compressed[name]
            return functools.partial(_whole_index, count, info.size_bytes, raw_bytes, codec)
        return functools.partial(build_records, ctx.storage, info, ctx.name, count)

    indexes = await _bounded(
        [
            functools.partial(_index_for, ctx, info, fmt, builder(name, info, count))
            for name, info, count in zip(names, infos, counts, strict=True)
        ]
    )
    from zephon.formats.litdata import LitDataCodec
    from zephon.formats.mds import MdsCodec

    if fmt == "mds":
        columns = {
            ctx.root + name: (cols[0], cols[1], cols[2]) for name, cols in meta["columns"].items()
        }
        codec: Codec = MdsCodec(ctx.name, columns, ctx.allow_pickle)
    else:
        codec = LitDataCodec(ctx.name, meta["config"], ctx.allow_pickle)
    return infos, indexes, codec, meta


def _detect(
    ctx: _Context, objects: list[ObjectInfo], index_json: ObjectInfo | None, raw_index: bytes | None
) -> str:
    if ctx.persistent is not None:
        return ctx.persistent.format
    if raw_index is not None:
        try:
            obj = parse_json(raw_index)
        except ValueError as exc:
            if any(o.uri.endswith((".mds", ".bin")) for o in objects):
                # the shards an MDS or LitData index describes, with an index that does not parse
                raise FormatError(
                    f"index.json is not valid JSON ({exc})",
                    dataset=ctx.name,
                    uri=index_json.uri if index_json is not None else ctx.root,
                ) from None
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("shards"), list) and obj.get("version"):
            return "mds"
        if isinstance(obj, dict) and "chunks" in obj and "config" in obj:
            return "litdata"
        # Another tool's index beside shards of a format known by extension: not ours.
    visible = [o.uri for o in objects if not _hidden(o.uri, ctx.root)]
    found = {format_of(uri) for uri in visible} - {None}
    if len(found) > 1 and "jsonl" in found and not any(is_jsonl_by_name(u) for u in visible):
        found.discard("jsonl")  # .json files beside shards of another format: its metadata
    if not found and index_json is not None:
        raise FormatError(
            "index.json is neither an MDS nor a LitData index, and no shards of a known "
            "extension lie beside it",
            dataset=ctx.name,
            uri=index_json.uri,
        )
    if len(found) > 1:
        raise FormatError(
            f"mixed formats {sorted(f for f in found if f)}; pass format= to choose one",
            dataset=ctx.name,
            uri=ctx.root,
        )
    if not found:
        tars = [u for u in visible if u.lower().endswith((".tar.gz", ".tgz", ".tar.zst"))]
        raise FormatError(
            (
                f"compressed tars ({_basename(tars[0])}...) cannot be read by byte range: "
                "WebDataset shards must be plain .tar files (decompress them once)"
            )
            if tars
            else (
                "unknown format: no shards of a known kind: .jsonl/.json (optionally .gz/.zst/"
                ".bz2/.xz), .parquet, .tar (WebDataset), .vortex, a .lance directory, or an "
                "index.json of MDS or LitData; pass format="
            ),
            dataset=ctx.name,
            uri=ctx.root,
        )
    return str(found.pop())


async def discover(
    name: str,
    path: str | Sequence[str],
    storage: ManagedStorage,
    *,
    format: str | None,
    columns: Sequence[str] | None,
    allow_pickle: bool,
    cache: IndexCache | None,
    index_uri: str | None = None,
    keep_scan_bytes: int = 0,
    keep_scan_disk_bytes: int = 0,
    broadcast_index: bool = True,
) -> Discovered:
    """Find a dataset's shards and build every shard index (see the module docstring).
    Long because it is the one place where the discovery paths (persistent index, listing,
    cache) meet, in order."""
    if format is not None and format not in FORMATS:
        raise ConfigError(f"format must be one of {FORMATS}, got {format!r}")
    started = time.perf_counter()
    stats = DiscoveryStats()
    ctx = _Context(name, storage, cache, list(columns) if columns else None, allow_pickle, stats)
    before = (storage.stats.requests, storage.stats.bytes_read)
    try:
        described = format is None or FORMATS_BY_NAME[format].found_by == "index_json"
        where = await locate(
            storage, path, index_uri, format, name, cache, broadcast_index, described
        )
        objects, root = where.objects, where.root
        stats.listed = len(objects) if where.listed else 0
        ctx.root = root
        if keep_scan_bytes > 0 and scheme_of(root) not in ("file", "memory"):  # remote: keep
            ctx.keep = ScanKeep(keep_scan_bytes, keep_scan_disk_bytes)  # what a scan reads
        index_json: ObjectInfo | None = None
        persistent_info: ObjectInfo | None = None
        for o in objects if where.listed else ():
            if o.uri == root + "index.json":
                index_json = o
            elif o.uri == root + PERSISTENT_INDEX_NAME:
                persistent_info = o
        if len(objects) == 1 and _basename(objects[0].uri) in ("index.json", PERSISTENT_INDEX_NAME):
            objects = []  # the path named the index file itself
        if where.persistent is not None:
            ctx.persistent = where.persistent
        elif index_uri is not None or persistent_info is not None:
            persistent_info = persistent_info or await storage.stat(index_uri or "")
            try:
                ctx.persistent = PersistentIndex.from_bytes(
                    await read_whole(storage, persistent_info)
                )
            except ValueError as exc:
                raise FormatError(str(exc), dataset=name, uri=persistent_info.uri) from None
        if ctx.persistent is not None and format is not None and ctx.persistent.format != format:
            ctx.persistent = None  # an index of another format says nothing about this one
        if ctx.persistent is not None:
            ctx.by_uri = {root + e.path: e for e in ctx.persistent.entries}
        raw_index = None
        if index_json is not None and ctx.persistent is None and described:
            raw_index = await where.read_metadata(storage, index_json)
        fmt = format or _detect(ctx, objects, index_json, raw_index)
        if FORMATS_BY_NAME[fmt].found_by == "index_json":
            infos, indexes, codec, meta = await _indexed_format(
                ctx, fmt, index_json, raw_index, objects
            )
        else:
            if ctx.persistent is not None and not objects:  # an index over HTTP: no listing
                objects = [
                    ObjectInfo(root + e.path, e.size_bytes, e.version)
                    for e in ctx.persistent.entries
                ]
            infos, indexes, codec = await _simple_format(ctx, fmt, objects)
            meta = {}
    except StorageError as exc:
        exc.dataset = name
        raise
    shards = [
        ShardInfo(i.uri, idx.num_samples, i.size_bytes, i.version)
        for i, idx in zip(infos, indexes, strict=True)
    ]
    if ctx.columns is not None and not FORMATS_BY_NAME[fmt].projects_itself:
        codec = ProjectedCodec(codec, ctx.columns)
    stats.requests = storage.stats.requests - before[0]
    stats.bytes_read = storage.stats.bytes_read - before[1]
    stats.seconds = time.perf_counter() - started
    keep = ctx.keep if ctx.keep is not None and ctx.keep.kept else None
    return Discovered(fmt, root, shards, indexes, codec, meta, stats, keep)


async def discover_lance(
    name: str, path: str, options: dict[str, Any], columns: Sequence[str] | None
) -> Discovered:
    """The Lance dataset at ``path``: its manifest read (no listing, no shard bytes)."""
    from zephon.formats.lance import lance_shards

    started = time.perf_counter()
    root, shards, indexes, codec, meta = await lance_shards(name, path, options, columns)
    stats = DiscoveryStats()
    stats.seconds = time.perf_counter() - started
    return Discovered("lance", root, shards, list(indexes), codec, meta, stats)

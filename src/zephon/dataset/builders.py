"""Per-format index building: the only place where discovery reads shard bytes.

Each builder turns one shard's metadata (a footer, a header, or one streaming pass for formats
without random-access metadata) into its :mod:`zephon.formats.index` object.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable

from zephon.errors import FormatError, first_error
from zephon.formats import jsonl
from zephon.formats.compression import StreamDecompressor, inflate_limit, stream_kind
from zephon.formats.index import RecordIndex, RowGroupIndex, StreamIndex
from zephon.refs import ObjectInfo
from zephon.storage import ManagedStorage
from zephon.storage.gate import CapacityGate
from zephon.storage.keep import ScanKeep

__all__ = [
    "PARQUET_PROBE_BYTES",
    "SCAN_CHUNK_BYTES",
    "build_jsonl",
    "build_parquet",
    "build_records",
    "build_tar",
]

SCAN_CHUNK_BYTES = 8 << 20
# A Parquet file's last 64 KiB hold the footer of almost every real file: one read.
PARQUET_PROBE_BYTES = 64 * 1024
_SCAN_WINDOW = 2  # chunks in flight per scanned shard: ~16 MiB ahead, enough to hide latency
# Scanned bytes in flight (sent for, or received and not yet indexed), all of one discovery's
# shards together: 16 tars scanned two chunks at a time held 256 MiB at the peak. 64 MiB keeps
# the store as busy (benchmarks/peers.py, tars without an index, main process: the same first
# sample, peak RSS 496-514 -> 422-428 MB).
SCAN_INFLIGHT_BYTES = 64 << 20


async def scan_object(
    storage: ManagedStorage,
    info: ObjectInfo,
    feed: Callable[[bytes], None],
    keep: ScanKeep | None = None,
    gate: CapacityGate | None = None,
) -> None:
    """Read ``info`` start to end in chunks, several in flight, feeding them in order (and
    handing them to ``keep``, for the first epoch to read from memory). ``gate`` bounds the
    bytes in flight, shared with the other shards' scans: a chunk holds its bytes from before
    its read is sent until it has been fed."""
    starts = iter(range(0, info.size_bytes, SCAN_CHUNK_BYTES))
    unfed: dict[int, int] = {}  # chunks read and not yet fed: start -> bytes held in ``gate``

    async def fetch(start: int, stop: int) -> bytes:
        if gate is not None:
            await gate.acquire(stop - start)
        try:
            data = await storage.read(info.uri, start, stop, version=info.version)
        except BaseException:
            if gate is not None:
                gate.release(stop - start)
            raise
        unfed[start] = stop - start
        return data

    def read(start: int) -> tuple[int, asyncio.Task[bytes]]:
        return start, tg.create_task(fetch(start, min(start + SCAN_CHUNK_BYTES, info.size_bytes)))

    try:
        async with asyncio.TaskGroup() as tg:
            pending: deque[tuple[int, asyncio.Task[bytes]]] = deque()
            for start in starts:
                pending.append(read(start))
                if len(pending) == _SCAN_WINDOW:
                    break
            while pending:
                at, task = pending.popleft()
                data = await task
                following = next(starts, None)
                if following is not None:
                    pending.append(read(following))
                try:
                    feed(data)
                    if keep is not None:
                        keep.keep(info.uri, info.version, at, data)
                finally:
                    held = unfed.pop(at)
                    if gate is not None:
                        gate.release(held)
    except BaseExceptionGroup as group:  # the one failure that stopped the scan, never a group
        raise first_error(group) from None
    finally:  # a failure left chunks read and never fed: their bytes go back to the others
        if gate is not None:
            gate.release(sum(unfed.values()))


async def build_jsonl(
    storage: ManagedStorage,
    info: ObjectInfo,
    dataset: str,
    keep: ScanKeep | None = None,
    gate: CapacityGate | None = None,
) -> RecordIndex | StreamIndex:
    indexer = jsonl.LineIndexer()
    kind = stream_kind(info.uri)
    if kind is None:
        await scan_object(storage, info, indexer.feed, keep, gate)
        return RecordIndex(indexer.finish())
    decompress = StreamDecompressor(kind, inflate_limit(info.size_bytes))

    def feed(data: bytes) -> None:
        for piece in decompress.pieces(data):
            indexer.feed(piece)

    try:
        await scan_object(storage, info, feed, keep, gate)
        decompress.finish()
    except ValueError as exc:
        raise FormatError(str(exc), dataset=dataset, uri=info.uri) from None
    return StreamIndex(indexer.finish(), info.size_bytes)


async def build_parquet(
    storage: ManagedStorage,
    info: ObjectInfo,
    dataset: str,
    columns: list[str] | None,
    keep: ScanKeep | None = None,
) -> RowGroupIndex:
    """The footer, from a probe of the file's end (one more read for a larger footer). The
    probe's bytes before the footer (row-group data) go to ``keep`` for the first epoch."""
    probe = min(info.size_bytes, PARQUET_PROBE_BYTES)
    tail = await storage.read(
        info.uri, info.size_bytes - probe, info.size_bytes, version=info.version
    )
    from zephon.formats import parquet  # pyarrow: imported while the reads are in flight

    try:
        need = parquet.footer_length(tail, info.size_bytes)
        if need > len(tail):  # a large footer: one more read for the rest of it
            head = await storage.read(
                info.uri, info.size_bytes - need, info.size_bytes - len(tail), version=info.version
            )
            tail = head + tail
        index = parquet.index_from_footer(tail[len(tail) - need :], info.size_bytes, columns)
    except ValueError as exc:
        raise FormatError(str(exc), dataset=dataset, uri=info.uri) from None
    if keep is not None and info.version and need < len(tail):
        keep.keep(info.uri, info.version, info.size_bytes - len(tail), tail[: len(tail) - need])
    return index


async def build_tar(
    storage: ManagedStorage,
    info: ObjectInfo,
    dataset: str,
    keep: ScanKeep | None = None,
    gate: CapacityGate | None = None,
) -> RecordIndex:
    from zephon.formats import webdataset

    indexer = webdataset.TarIndexer()
    try:
        await scan_object(storage, info, indexer.feed, keep, gate)
        indexer.finish()
    except ValueError as exc:
        raise FormatError(f"corrupt tar: {exc}", dataset=dataset, uri=info.uri) from None
    return RecordIndex(webdataset.sample_offsets(indexer.members, info.size_bytes))


async def build_records(
    storage: ManagedStorage, info: ObjectInfo, dataset: str, num_samples: int
) -> RecordIndex:
    """MDS and LitData: the header holds the offsets; one range read."""
    from zephon.formats import records

    data = await storage.read(info.uri, 0, records.header_bytes(num_samples), version=info.version)
    try:
        return records.parse_offsets_header(data, num_samples, info.size_bytes)
    except ValueError as exc:
        raise FormatError(f"corrupt shard header: {exc}", dataset=dataset, uri=info.uri) from None

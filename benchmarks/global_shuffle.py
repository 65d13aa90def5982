"""Reads of a global shuffle of small records: bytes and requests against a minimal plan.

``--docs`` documents of ~1.6 KB (the peers benchmark's text, 4,000 per JSONL shard, with a
persistent index) on a moto server; one epoch with ``shuffle="global"`` per row, in this
process, counting the storage reads and bytes the pipeline makes:

- ``minimal``: ``coalesce_gap_bytes=0`` and no range cache: each read is a run of neighbouring
  samples and nothing else, the fewest bytes (the data) in the most requests;
- the default (a cost-based rule: a gap between two samples is read through only while the
  bytes it wastes, those the range cache will not serve later, stay within 30% of the
  samples'), with the default range cache (64 MiB) and with 8 MiB;
- ``flat gap``: every gap under ``coalesce_gap_bytes`` (64 KiB) read through, as before the
  rule, at both cache sizes.

    .venv/bin/python benchmarks/global_shuffle.py [--docs 16000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from peers import upload, write_documents
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.plan import coalesce
from zephon.testing import MotoServer


def epoch(ds: Dataset, cache: int, gap: int | None = None) -> dict[str, Any]:
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="global", stop_after_passes=1)
    if gap is not None:
        ws = StaticMixtureWorkSource(
            [ds], seed=0, shuffle="global", stop_after_passes=1, coalesce_gap_bytes=gap
        )
    pipe = Pipeline(ws, rank=0, world_size=1, range_cache_bytes=cache)
    started = time.perf_counter()
    n = sum(1 for _ in pipe)
    fetch = pipe.stats()["fetch"]
    seconds = time.perf_counter() - started
    return {"samples": n, "requests": fetch["requests"], "bytes": fetch["bytes"], "s": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=16000)
    args = parser.parse_args()
    import peers

    peers.SHARDS = max(1, args.docs // peers.PER_SHARD)
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as work:
        client = endpoint.client()
        client.create_bucket(Bucket=peers.BUCKET)
        write_documents(Path(work) / "docs")
        size = upload(client, Path(work) / "docs", "web")
        options = endpoint.storage_options()
        url = f"s3://{peers.BUCKET}/web/"
        asyncio.run(Dataset.from_path("w", url, storage_options=options).awrite_index())
        ds = Dataset.from_path("w", url, storage_options=options, index_cache=False)
        rows: list[tuple[str, dict[str, Any]]] = [("minimal", epoch(ds, 0, gap=0))]
        for cache in (64 << 20, 8 << 20):
            rows.append((f"cost rule, cache {cache >> 20} MiB", epoch(ds, cache)))
        flat = coalesce._worth_reading
        coalesce._worth_reading = lambda gaps, *_: gaps >= gaps.min()  # type: ignore[assignment]
        try:
            for cache in (64 << 20, 8 << 20):
                rows.append((f"flat gap, cache {cache >> 20} MiB", epoch(ds, cache)))
        finally:
            coalesce._worth_reading = flat  # type: ignore[assignment]
        least = rows[0][1]["requests"]
        print(
            f"# global shuffle of {ds.num_samples:,} records ({size / ds.num_samples / 1e3:.1f} "
            f"KB each, {size / 1e6:.0f} MB), one epoch; load {os.getloadavg()[0]:.1f}"
        )
        print(f"{'plan':<26} {'requests':>9} {'x minimal':>9} {'MB':>7} {'x data':>7} {'s':>6}")
        for label, r in rows:
            print(
                f"{label:<26} {r['requests']:>9,} {r['requests'] / least:>8.2f}x "
                f"{r['bytes'] / 1e6:>7.1f} {r['bytes'] / size:>6.2f}x {r['s']:>6.1f}"
            )


if __name__ == "__main__":
    main()

"""Discovery of 1,000 shards on the local S3 server: scan vs local cache vs persistent index.

Every variant discovers the same dataset in the same run; the table shows wall time, requests
and bytes read, so the claim "discovery cost grows with shards, not samples, and a persistent
index makes it a listing plus one read" is measured, not asserted.

    .venv/bin/python benchmarks/discovery.py [--shards 1000] [--samples-per-shard 200]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from zephon.dataset import Dataset
from zephon.testing import MotoServer


def _jsonl(shard: int, n: int) -> bytes:
    return b"".join(
        json.dumps({"id": shard * n + i, "text": "lorem ipsum " * (i % 7 + 1)}).encode() + b"\n"
        for i in range(n)
    )


def _parquet(shard: int, n: int) -> bytes:
    table = pa.Table.from_pylist([{"id": shard * n + i, "text": "x" * (i % 50)} for i in range(n)])
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=max(1, n // 4))
    return buf.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--samples-per-shard", type=int, default=200)
    args = parser.parse_args()
    with MotoServer() as endpoint, tempfile.TemporaryDirectory() as cache:
        endpoint.create_bucket("disc")
        client = endpoint.client()
        n = args.samples_per_shard

        def put(i: int) -> None:
            client.put_object(Bucket="disc", Key=f"jsonl/part-{i:05d}.jsonl", Body=_jsonl(i, n))
            client.put_object(Bucket="disc", Key=f"pq/part-{i:05d}.parquet", Body=_parquet(i, n))

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, range(args.shards)))
        options = endpoint.storage_options()
        print(f"# {args.shards} shards x {n} samples on the local S3 server (moto)")
        print(f"{'dataset / variant':<42} {'seconds':>8} {'requests':>9} {'MB read':>8}")

        def run(label: str, path: str, **kw: object) -> Dataset:
            ds = asyncio.run(Dataset.afrom_path("bench", path, storage_options=options, **kw))  # type: ignore[arg-type]
            st = ds.discovery_stats
            assert ds.num_samples == args.shards * n
            print(f"{label:<42} {st.seconds:>8.2f} {st.requests:>9} {st.bytes_read / 1e6:>8.2f}")
            return ds

        ds = run("jsonl: scan (no cache, no index)", "s3://disc/jsonl/", index_cache=False)
        run("jsonl: local index cache (cold)", "s3://disc/jsonl/", index_cache=cache)
        run("jsonl: local index cache (warm)", "s3://disc/jsonl/", index_cache=cache)
        asyncio.run(ds.awrite_index())
        run("jsonl: persistent index", "s3://disc/jsonl/", index_cache=False)
        ds = run("parquet: footers (no cache, no index)", "s3://disc/pq/", index_cache=False)
        asyncio.run(ds.awrite_index())
        run("parquet: persistent index", "s3://disc/pq/", index_cache=False)
        _new_formats(args.shards, n, client, options, run)


def _new_formats(shards: int, n: int, client: Any, options: dict[str, Any], run: Any) -> None:
    """Vortex files (a footer read each) and one Lance dataset (its manifest), same shape."""
    import lance
    import vortex as vx

    from zephon.formats.lance import lance_options

    with tempfile.TemporaryDirectory() as tmp:
        for i in range(shards):
            path = f"{tmp}/part-{i:05d}.vortex"
            rows = [{"id": i * n + j, "text": "x" * (j % 50)} for j in range(n)]
            vx.io.write(vx.array(pa.Table.from_pylist(rows)), path)
            with open(path, "rb") as f:
                client.put_object(Bucket="disc", Key=f"vortex/part-{i:05d}.vortex", Body=f.read())
    ds = run("vortex: footers (no cache, no index)", "s3://disc/vortex/", index_cache=False)
    asyncio.run(ds.awrite_index())
    run("vortex: persistent index", "s3://disc/vortex/", index_cache=False)
    table = pa.Table.from_pylist([{"id": k, "text": "x" * (k % 50)} for k in range(shards * n)])
    uri = "s3://disc/data.lance"
    lance.write_dataset(
        table, uri, max_rows_per_file=n, storage_options=lance_options(uri, options)
    )
    run("lance: manifest (Lance's own reads, not counted)", uri)


if __name__ == "__main__":
    main()

"""WebDataset decoding: a read's samples decoded a run at a time (headers read by numpy a
round per member, ``formats/tarblocks.py``) against the same samples parsed one header at a
time, on a tar as Python's ``tarfile`` writes it and on one as WebDataset's writer does (a PAX
header with the ``mtime`` before every member). Microseconds a sample, best of ``--runs``.

    .venv/bin/python benchmarks/tar_decode.py [--samples 4000] [--runs 7]
"""

from __future__ import annotations

import argparse
import io
import json
import tarfile
import time
from collections.abc import Callable

from zephon.formats.blob import Blob
from zephon.formats.index import RecordIndex
from zephon.formats.webdataset import TarIndexer, WebDatasetCodec, sample_offsets
from zephon.refs import ShardInfo


def shard(samples: int, pax: bool) -> bytes:
    """``samples`` JSON documents of ~1.5 KB, one member each."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(samples):
            body = json.dumps({"id": i, "text": "x" * 1500}).encode()
            info = tarfile.TarInfo(f"{i:08d}.json")
            info.size = len(body)
            info.mtime = 1_700_000_000.5 if pax else 1_700_000_000  # a float: a PAX record
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def best_us(call: Callable[[], object], samples: int, runs: int) -> float:
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        call()
        times.append(time.perf_counter() - began)
    return min(times) / samples * 1e6


def compare(data: bytes, samples: int, runs: int) -> tuple[float, float]:
    """(one by one, a run at a time) in microseconds a sample."""
    indexer = TarIndexer()
    indexer.feed(data)
    indexer.finish()
    _, _, data_at, size = indexer.members[-1]
    index = RecordIndex(sample_offsets(indexer.members, data_at + -(-size // 512) * 512))
    codec = WebDatasetCodec("bench")
    info = ShardInfo("mem://shard.tar", samples, len(data), "1")
    blob, wanted = Blob([(0, data)]), list(range(samples))
    one = best_us(lambda: [codec._decode_one(info, index, blob, i) for i in wanted], samples, runs)
    run = best_us(lambda: codec.decode(info, index, blob, wanted), samples, runs)
    return one, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    for pax in (False, True):
        one, run = compare(shard(args.samples, pax), args.samples, args.runs)
        kind = "WebDataset's writer (PAX mtime)" if pax else "tarfile, plain ustar"
        print(f"{kind:32s} one by one {one:.2f} us, a run at a time {run:.2f} us: {one / run:.2f}x")


if __name__ == "__main__":
    main()

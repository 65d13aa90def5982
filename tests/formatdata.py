"""Test datasets written with each format's own writer, and their reference readings."""

from __future__ import annotations

import gzip
import io
import json
import random
import tarfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from tests.fixtures.make_reference_shards import to_jsonable as to_jsonable

FIXTURES = Path(__file__).parent / "fixtures" / "data"
WORDS = ["alpha", "beta", "gamma", "ünïcode", "émoji 🚀", 'quo"te', "tab\tsep", "back\\slash"]


def records(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    return [
        {
            "id": i,
            "text": " ".join(rng.choices(WORDS, k=rng.randrange(1, 40))),
            "score": rng.random(),
            "tags": rng.sample(WORDS, rng.randrange(0, 3)),
        }
        for i in range(n)
    ]


def write_jsonl(root: Path, shards: int = 5, per_shard: int = 57) -> list[dict[str, Any]]:
    """Plain shards with the awkward parts of real JSONL: blank lines, CRLF, an indented
    object, no newline at the end of the last shard."""
    root.mkdir(parents=True, exist_ok=True)
    expected: list[dict[str, Any]] = []
    for s in range(shards):
        recs = records(per_shard, seed=s)
        lines = [json.dumps(r, ensure_ascii=s % 2 == 0) for r in recs]
        body = "\n".join(lines[:10]) + "\n\n   \n" + "\r\n".join(lines[10:20]) + "\r\n"
        body += "   " + "\n".join(lines[20:])
        body += "" if s == shards - 1 else "\n"
        (root / f"part-{s}.jsonl").write_text(body, encoding="utf-8")
        expected.extend(recs)
    return expected


def write_compressed_jsonl(root: Path) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    a, b = records(40, seed=10), records(33, seed=11)
    (root / "a.jsonl.gz").write_bytes(
        gzip.compress("".join(json.dumps(r) + "\n" for r in a).encode())
    )
    raw = "".join(json.dumps(r) + "\n" for r in b).encode()
    (root / "b.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(raw))
    return a + b


def write_more_compressed_jsonl(root: Path) -> list[dict[str, Any]]:
    """bz2 and xz shards, and the concatenated streams parallel compressors write (pigz-style
    gzip members, zstd frames, pbzip2-style bz2 streams)."""
    import bz2
    import lzma

    root.mkdir(parents=True, exist_ok=True)
    parts = [records(n, seed=20 + n) for n in (31, 17, 25, 12, 9)]
    raw = ["".join(json.dumps(r) + "\n" for r in p).encode() for p in parts]
    (root / "a.jsonl.bz2").write_bytes(bz2.compress(raw[0]))
    (root / "b.jsonl.xz").write_bytes(lzma.compress(raw[1]))
    half = len(raw[2]) // 2  # a member boundary inside a line
    (root / "c.jsonl.gz").write_bytes(gzip.compress(raw[2][:half]) + gzip.compress(raw[2][half:]))
    z = zstandard.ZstdCompressor()
    (root / "d.jsonl.zst").write_bytes(z.compress(raw[3][:100]) + z.compress(raw[3][100:]))
    (root / "e.json.bz2").write_bytes(bz2.compress(raw[4][:50]) + bz2.compress(raw[4][50:]))
    return [r for p in parts for r in p]


def write_parquet(root: Path, shards: int = 3) -> list[dict[str, Any]]:
    root.mkdir(parents=True, exist_ok=True)
    expected: list[dict[str, Any]] = []
    for s in range(shards):
        recs = records(250 + 37 * s, seed=100 + s)
        for r in recs:
            r["vec"] = [r["score"], -r["score"]]
        table = pa.Table.from_pylist(recs)
        pq.write_table(table, root / f"shard-{s:02d}.parquet", row_group_size=64)
        expected.extend(pq.read_table(root / f"shard-{s:02d}.parquet").to_pylist())
    return expected


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(root: Path, shards: int = 3, per_shard: int = 20) -> list[dict[str, Any]]:
    """Tar shards in GNU and PAX form, with names long enough to need extended headers."""
    root.mkdir(parents=True, exist_ok=True)
    rng = random.Random(5)
    for s in range(shards):
        fmt = tarfile.GNU_FORMAT if s % 2 == 0 else tarfile.PAX_FORMAT
        with tarfile.open(root / f"shard-{s:04d}.tar", "w", format=fmt) as tar:
            for i in range(per_shard):
                deep = "d" * 120 + "/" if i % 7 == 3 else ""
                key = f"{deep}s{s:02d}/sample{i:05d}"
                _add(tar, f"{key}.txt", " ".join(rng.choices(WORDS, k=5)).encode())
                _add(tar, f"{key}.json", json.dumps({"i": i}).encode())
                if i % 3 == 0:
                    _add(tar, f"{key}.seg.bin", rng.randbytes(rng.randrange(0, 2000)))
    return read_webdataset_reference(root)


def read_webdataset_reference(root: Path) -> list[dict[str, Any]]:
    """Group members by key with the standard library's tar reader."""
    out: list[dict[str, Any]] = []
    for path in sorted(root.glob("*.tar")):
        with tarfile.open(path) as tar:
            for member in tar:
                name = member.name
                slash = name.rfind("/")
                dot = name.find(".", slash + 1)
                key, ext = name[:dot], name[dot + 1 :]
                data = tar.extractfile(member).read()  # type: ignore[union-attr]
                if not out or out[-1]["__key__"] != key:
                    out.append({"__key__": key})
                out[-1][ext] = data
    return out


def reference(name: str) -> list[Any]:
    return list(json.loads((FIXTURES / name / "reference.json").read_text()))

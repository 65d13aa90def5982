"""The fuzz corpus: ``tests/fuzz/corpus/<target>/`` holds inputs per target (seeds written by
:func:`write_seeds` from the test fixtures, and what fuzzing found worth keeping: inputs that
reached new code, and every input that once crashed a target, under ``crash-*``)."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

CORPUS = Path(__file__).parent / "corpus"
FIXTURES = Path(__file__).parents[1] / "fixtures" / "data"
MAX_SEED_BYTES = 64 << 10


def files(target: str) -> list[Path]:
    """The corpus inputs of ``target``, in a stable order."""
    return sorted((CORPUS / target).glob("*")) if (CORPUS / target).is_dir() else []


def add(target: str, data: bytes, prefix: str = "seed") -> Path:
    """Keep ``data`` in ``target``'s corpus (named by its content)."""
    folder = CORPUS / target
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{prefix}-{hashlib.sha1(data).hexdigest()[:16]}"
    path.write_bytes(data)
    return path


def _jpegs() -> list[bytes]:
    import numpy as np
    from PIL import Image

    from tests.bombs import jpeg_scan_bomb

    out = []
    rng = np.random.default_rng(0)
    for i, (mode, options) in enumerate(
        [
            ("RGB", {}),
            ("RGB", {"progressive": True}),
            ("L", {}),
            ("RGB", {"subsampling": 0}),
            ("RGB", {"subsampling": 1, "quality": 50}),
        ]
    ):
        pixels = rng.integers(0, 255, (40 + 8 * i, 56 + 4 * i, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).convert(mode).save(buf, "JPEG", **options)
        out.append(buf.getvalue())
    out.append(jpeg_scan_bomb(64, 48, bands=3, bits=2))
    return out


def _tars() -> list[bytes]:
    out = []
    for members in (
        [("0.txt", b"a"), ("0.json", b"{}"), ("1.txt", b"b")],
        [("dir/" + "n" * 120 + ".txt", b"long name"), ("x.cls", b"3")],
    ):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members:
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out.append(buf.getvalue())
    return out


def _parquet() -> list[bytes]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = []
    table = pa.table(
        {
            "id": list(range(50)),
            "text": [f"row {i}" for i in range(50)],
            "v": [[i, i + 1] for i in range(50)],
        }
    )
    for options in ({}, {"compression": "zstd"}, {"use_dictionary": False, "row_group_size": 20}):
        buf = io.BytesIO()
        pq.write_table(table, buf, **options)
        out.append(buf.getvalue())
    return out


def _chats() -> list[bytes]:
    turns = [
        {"role": "system", "content": "terse"},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "\ue000x\ue001"},
        {"role": "assistant", "content": "no"},
    ]
    return [json.dumps({"messages": turns}).encode(), json.dumps(turns[:3]).encode()]


def seeds() -> dict[str, list[bytes]]:
    """The seed inputs of every target, from the fixtures and small files made here."""
    jsonl = b"".join(json.dumps({"id": i, "text": "x" * i}).encode() + b"\n" for i in range(20))
    return {
        "jsonl": [jsonl, b'{"a": 1}\n\n  {"b": [1, 2]}\n{"c": "\\u00e9"}', b"[1, 2]\n"],
        "parquet-footer": _parquet(),
        "parquet-file": _parquet(),
        "tar": _tars(),
        "mds-index": [(FIXTURES / "mds" / "index.json").read_bytes()],
        "mds-samples": [(FIXTURES / "mds" / "shard.00000.mds").read_bytes()],
        "litdata-index": [(FIXTURES / "litdata" / "index.json").read_bytes()],
        "litdata-samples": [(FIXTURES / "litdata" / "chunk-0-0.bin").read_bytes()],
        "jpeg": _jpegs(),
        "chat": _chats(),
    }


def write_seeds() -> None:
    for target, inputs in seeds().items():
        for data in inputs:
            if len(data) <= MAX_SEED_BYTES:
                add(target, data)


if __name__ == "__main__":
    write_seeds()

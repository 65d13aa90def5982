"""The data the documentation's examples read, on a local S3 server: ``serve_examples()``.

Every example in the README and the docs reads ``s3://bucket/...`` as printed. Its first lines
call :func:`serve_examples`, which starts a local S3 server (moto) for the rest of the script,
fills ``s3://bucket/`` with small datasets of every kind the examples use, points the AWS
environment at it, and writes ``tokenizer.json`` (a small BPE) in the working directory if
there is none. With your own bucket, leave that call out.

| prefix | what |
| --- | --- |
| ``web/`` | JSONL documents (``id``, ``text``) |
| ``code/`` | Parquet (``text``, ``lang``) |
| ``images/`` | WebDataset tars of JPEGs with captions (``jpg``, ``txt``) |
| ``photos/``, ``captions/`` | JPEG objects, and JSONL captions naming them (``image_key``) |
| ``mds/``, ``litdata/`` | MosaicML MDS and LitData shards (from the repository's fixtures) |
"""

from __future__ import annotations

import atexit
import contextlib
import io
import json
import os
import tarfile
from pathlib import Path
from typing import Any

from zephon.testing.servers import MotoServer

__all__ = ["fill_examples", "serve_examples"]

WORDS = ["stream", "shard", "range", "token", "batch", "lane", "mixture", "the", "of"]
_FIXTURES = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "data"
_served: dict[str, Any] = {}


def serve_examples(bucket: str = "bucket", workdir: str | os.PathLike[str] = ".") -> dict[str, Any]:
    """Start a local S3 server holding the examples' data in ``bucket`` (once per process; it
    stops when the process ends), point ``AWS_ENDPOINT_URL`` and test credentials at it, and
    write ``tokenizer.json`` in ``workdir`` if missing. Returns the ``storage_options`` that
    reach it (the environment already does). Needs moto: ``pip install 'zephon[demo]'``."""
    if bucket in _served:
        return dict(_served[bucket])
    server = MotoServer()
    endpoint = server.start()
    atexit.register(server.stop)
    fill_examples(endpoint.client(), bucket, Path(workdir))
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": endpoint.endpoint_url,
            "AWS_ACCESS_KEY_ID": endpoint.key,
            "AWS_SECRET_ACCESS_KEY": endpoint.secret,
            "AWS_DEFAULT_REGION": endpoint.region_name,
        }
    )
    _served[bucket] = endpoint.storage_options()
    return dict(_served[bucket])


def fill_examples(client: Any, bucket: str, workdir: Path) -> None:
    """Put the examples' datasets in ``bucket`` (created if needed) through an S3 ``client``,
    and write ``workdir/tokenizer.json`` if missing."""
    with contextlib.suppress(client.exceptions.BucketAlreadyOwnedByYou):
        client.create_bucket(Bucket=bucket)

    def put(key: str, body: bytes) -> None:
        client.put_object(Bucket=bucket, Key=key, Body=body)

    for s in range(3):
        lines = [
            json.dumps(
                {
                    "id": s * 1000 + i,
                    "text": " ".join(WORDS[(i + k) % 9] for k in range(8 + i % 30)),
                }
            )
            for i in range(200)
        ]
        put(f"web/part-{s}.jsonl", ("\n".join(lines) + "\n").encode())
    import pyarrow as pa
    import pyarrow.parquet as pq

    for s in range(2):
        table = pa.table(
            {"text": [f"def f{i}(): return {i}" for i in range(150)], "lang": ["python"] * 150}
        )
        out = io.BytesIO()
        pq.write_table(table, out, row_group_size=50)
        put(f"code/part-{s}.parquet", out.getvalue())
    for name in ("mds", "litdata"):
        folder = _FIXTURES / name
        if folder.is_dir():
            for f in sorted(folder.iterdir()):
                if f.name != "reference.json":
                    put(f"{name}/{f.name}", f.read_bytes())
    with contextlib.suppress(ImportError):  # images need Pillow (the images extra)
        for s in range(2):
            put(f"images/pairs-{s}.tar", _image_tar(s))
        rows = []
        for i, (member, data) in enumerate(_members(_image_tar(2), "jpg")):
            put(f"photos/{member}", data)
            rows.append(json.dumps({"caption": f"photo {i}", "image_key": member}))
        put("captions/part-0.jsonl", ("\n".join(rows) + "\n").encode())
    tokenizer = workdir / "tokenizer.json"
    if not tokenizer.exists():
        with contextlib.suppress(ImportError):  # the tokenizers extra
            _write_tokenizer(tokenizer)


def _write_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=100, special_tokens=["[UNK]", "<s>", "</s>"])
    tok.train_from_iterator(WORDS * 20, trainer)
    tok.save(str(path))


def _image_tar(shard: int, n: int = 16) -> bytes:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(shard)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for i in range(shard * n, (shard + 1) * n):
            pixels = rng.integers(0, 255, (int(rng.integers(100, 300)), 240, 3), dtype=np.uint8)
            jpeg = io.BytesIO()
            Image.fromarray(pixels).save(jpeg, format="JPEG", quality=85)
            for ext, data in (("jpg", jpeg.getvalue()), ("txt", f"photo {i}".encode())):
                info = tarfile.TarInfo(f"{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _members(tar: bytes, ext: str) -> list[tuple[str, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        return [
            (m.name, t.extractfile(m).read())  # type: ignore[union-attr]
            for m in t.getmembers()
            if m.name.endswith(ext)
        ]

"""fetch_field against a real S3 server (moto): JSONL rows naming image objects by key or URI,
read through the dataset's storage, decoded, resumed exactly; missing objects named or skipped."""

from __future__ import annotations

import io
import json
from typing import Any

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError, FormatError
from zephon.testing import S3Endpoint

Image = pytest.importorskip("PIL.Image")


def jpeg(i: int) -> bytes:
    img = np.full((40 + i % 7, 50, 3), (i * 17 % 256, 90, 200), np.uint8)
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def setup(endpoint: S3Endpoint, bucket: str, n: int, missing: set[int] = frozenset()) -> Dataset:
    """``n`` JSONL rows in two shards under ``meta/``; even rows name their image by a key
    under ``images/`` (given as ``prefix``), odd rows by a full URI."""
    client = endpoint.client()
    rows = []
    for i in range(n):
        key = f"images/{i:04d}.jpg"
        if i not in missing:
            client.put_object(Bucket=bucket, Key=key, Body=jpeg(i))
        ref = f"{i:04d}.jpg" if i % 2 == 0 else f"s3://{bucket}/{key}"
        rows.append(json.dumps({"id": i, "caption": f"picture {i}", "image": ref}))
    for s in range(2):
        body = "\n".join(rows[s * n // 2 : (s + 1) * n // 2]) + "\n"
        client.put_object(Bucket=bucket, Key=f"meta/part-{s}.jsonl", Body=body.encode())
    return Dataset.from_path(
        "pairs", f"s3://{bucket}/meta/", storage_options=endpoint.storage_options()
    )


def pipeline(ds: Dataset, bucket: str, **kw: Any) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=3, stop_after_passes=1)
    return (
        Pipeline(ws, rank=0, world_size=1, **kw)
        .fetch_field("image", "jpg", prefix=f"s3://{bucket}/images/", inflight=8)
        .decode_image("jpg")
    )


def test_rows_naming_images_by_key_or_uri_get_their_pixels(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    ds = setup(s3_endpoint, s3_bucket, 40)
    pipe = pipeline(ds, s3_bucket)
    out = list(pipe)
    assert sorted(s["id"] for s in out) == list(range(40))
    for s in out:
        assert s["jpg"].shape == (40 + s["id"] % 7, 50, 3)
        assert abs(int(s["jpg"][0, 0, 0]) - s["id"] * 17 % 256) <= 3  # its own picture
    assert "fetch_field('image', out='jpg'" in pipe.explain()
    # exact resume in the middle: the rest is what an uninterrupted run delivers
    interrupted = pipeline(ds, s3_bucket)
    it = iter(interrupted)
    first = [next(it) for _ in range(13)]
    state = interrupted.checkpoint()
    interrupted.close()
    resumed = pipeline(ds, s3_bucket)
    resumed.restore(state)
    rest = list(resumed)
    assert [s["id"] for s in first + rest] == [s["id"] for s in out]


def test_a_missing_object_names_the_sample_or_is_skipped_and_counted(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    ds = setup(s3_endpoint, s3_bucket, 20, missing={6, 11})
    with pytest.raises(FormatError, match=r"does not exist.*dataset 'pairs'.*sample") as info:
        list(pipeline(ds, s3_bucket))
    assert "0006.jpg" in str(info.value) or "0011.jpg" in str(info.value)
    pipe = pipeline(ds, s3_bucket, on_error="skip")
    assert sorted(s["id"] for s in pipe) == [i for i in range(20) if i not in (6, 11)]
    skipped = pipe.stats()["skipped"]
    assert sorted((s["shard"].rsplit("/", 1)[1], s["sample"]) for s in skipped) == [
        ("part-0.jsonl", 6),
        ("part-1.jsonl", 1),
    ]
    assert all(s["dataset"] == "pairs" and "does not exist" in s["error"] for s in skipped)


def test_a_uri_outside_the_store_or_a_non_string_is_bad_input(
    s3_endpoint: S3Endpoint, s3_bucket: str
) -> None:
    ds = setup(s3_endpoint, s3_bucket, 4)
    ws = StaticMixtureWorkSource([ds], seed=3, stop_after_passes=1)
    with pytest.raises(FormatError, match="outside the dataset's store"):
        list(Pipeline(ws).map(_elsewhere).fetch_field("image"))
    with pytest.raises(FormatError, match="field 'id' holds int, not an object key"):
        list(Pipeline(ws).fetch_field("id"))
    with pytest.raises(ConfigError, match="inflight"):
        Pipeline(ws).fetch_field("image", inflight=0)


def _elsewhere(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "image": "https://example.com/a.jpg"}

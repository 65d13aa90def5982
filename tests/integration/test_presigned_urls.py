"""Presigned URLs (a signature in the query string) as shards over HTTP: read by range,
their format found from the path, their checkpoints restorable once they are signed again,
and the signature in no error or checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.formatdata import write_compressed_jsonl, write_jsonl
from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import AccessDenied
from zephon.testing import S3Endpoint, StaticHTTPServer

pytestmark = pytest.mark.integration


def _ids(items: list[dict[str, object]]) -> list[object]:
    return sorted(json.dumps(x, sort_keys=True) for x in items)


def test_presigned_s3_urls_are_shards_and_a_new_signature_restores(
    s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path
) -> None:
    records = write_jsonl(tmp_path / "web", shards=3, per_shard=40)
    records += write_compressed_jsonl(tmp_path / "web")  # .jsonl.gz / .zst beside them
    client = s3_endpoint.client()
    keys = []
    for path in sorted((tmp_path / "web").iterdir()):
        keys.append(f"web/{path.name}")
        client.upload_file(str(path), s3_bucket, keys[-1])

    def signed(expires: int) -> list[str]:
        return [
            client.generate_presigned_url(
                "get_object", ExpiresIn=expires, Params={"Bucket": s3_bucket, "Key": k}
            )
            for k in keys
        ]

    urls = signed(600)
    assert all("Signature=" in u for u in urls)
    ds = Dataset.from_path("web", urls)  # over HTTP, each URL as given
    assert ds.format == "jsonl" and ds.num_samples == len(records)
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="global")
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2)
    it = iter(pipe)
    head = [next(it) for _ in range(25)]
    state = pipe.checkpoint()
    pipe.close()
    assert "Signature" not in json.dumps(state)
    again = Dataset.from_path("web", signed(900))  # other signatures, the same data
    rest = Pipeline(
        StaticMixtureWorkSource([again], seed=1, shuffle="global"), rank=0, world_size=1, lanes=2
    )
    rest.restore(state)
    assert _ids(head + list(rest)) == _ids(records)
    one = Dataset.from_path("one", urls[0])  # a single URL: its "?" starts no glob
    assert one.num_samples == 40


def test_a_server_that_refuses_head_is_read_with_a_ranged_get(tmp_path: Path) -> None:
    """A presigned URL is signed for GET: HEAD gets 403, as does a wrong signature."""
    records = write_jsonl(tmp_path / "data", shards=2, per_shard=30)
    with StaticHTTPServer(tmp_path / "data", signature="s3cr3t") as url:
        names = sorted(p.name for p in (tmp_path / "data").iterdir())
        urls = [f"{url}/{n}?X-Amz-Expires=600&X-Amz-Signature=s3cr3t" for n in names]
        ds = Dataset.from_path("signed", urls)
        assert ds.num_samples == len(records)
        pipe = Pipeline(StaticMixtureWorkSource([ds], seed=0), rank=0, world_size=1)
        assert _ids(list(pipe)) == _ids(records)
        with pytest.raises(AccessDenied) as info:
            Dataset.from_path("wrong", [u.replace("s3cr3t", "guess") for u in urls])
        assert "guess" not in str(info.value) and "X-Amz-Signature=***" in str(info.value)

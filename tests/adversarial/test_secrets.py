"""A secret in ``storage_options`` appears in no error, repr, log, stats, explain output or
checkpoint, on the paths a user sees."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ZephonError
from zephon.storage import open_storage
from zephon.testing import S3Endpoint, StaticHTTPServer

KEY = "AKIAFAKEKEY1234567890"
SECRET = "fake/Secret+Value=DoNotLeak0123456789"
TOKEN = "FakeSessionToken-9876543210"


def _leaks(text: str) -> list[str]:
    return [s for s in (KEY, SECRET, TOKEN) if s in text]


@pytest.mark.integration
async def test_a_fake_key_appears_nowhere(
    s3_endpoint: S3Endpoint, s3_bucket: str, caplog: pytest.LogCaptureFixture
) -> None:
    if S3Endpoint.from_env() is not None:
        pytest.skip("an external S3 checks its keys")
    caplog.set_level(logging.DEBUG)
    body = "".join(json.dumps({"id": i, "text": "x" * 20}) + "\n" for i in range(300))
    s3_endpoint.client().put_object(Bucket=s3_bucket, Key="d/a.jsonl", Body=body.encode())
    options = {
        "endpoint_url": s3_endpoint.endpoint_url,
        "key": KEY,
        "secret": SECRET,
        "token": TOKEN,
    }
    seen: list[str] = []
    ds = await Dataset.afrom_path("s", f"s3://{s3_bucket}/d/", storage_options=options)
    seen += [repr(ds), str(ds.shards), json.dumps(ds.location())]
    async with open_storage(f"s3://{s3_bucket}/", options) as storage:
        seen.append(repr(storage))
        seen.append(repr(getattr(storage, "backend", "")))
        for bad in (f"s3://{s3_bucket}/missing", f"s3://no-such-bucket-{s3_bucket}/x"):
            with pytest.raises(ZephonError) as info:
                await storage.read(bad, 0, 10)
            seen += [
                str(info.value),
                repr(info.value),
                "".join(getattr(info.value, "__notes__", [])),
            ]
    pipe = Pipeline(StaticMixtureWorkSource([ds]), rank=0, world_size=1, lanes=2).batch(10)
    n = 0
    async for _ in pipe:
        n += 1
        if n == 5:
            break
    seen += [json.dumps(pipe.checkpoint()), json.dumps(pipe.stats(), default=str), pipe.explain()]
    # Every log record: Zephon's, and those of the clients it configured (botocore's DEBUG
    # records hold signed headers: the session token, the access key id, the signature).
    records = [r.getMessage() for r in caplog.records]
    assert any(r.startswith("Sending http request") for r in records)  # botocore's, seen
    seen += records
    assert _leaks("\n".join(seen)) == []


PASSWORD = "Pa55-DoNotLeak-42"
SIGNATURE = "0123456789abcdefSIGNATURE"
HTTP_TOKEN = "SessionTokenInTheQuery-777"


@pytest.mark.integration
def test_secrets_inside_urls_reach_no_repr_stats_log_note_or_checkpoint(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A presigned URL (signature and session token in its query) with ``user:password@``:
    what a user prints, logs and saves never holds them."""
    caplog.set_level(logging.DEBUG)  # every logger: Zephon's and its clients'
    lines = [json.dumps({"id": i, "text": "x" * 20}) for i in range(200)]
    lines[17] = '{"id": 17, "text": '  # a bad record: skipped and listed in stats()
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    with StaticHTTPServer(tmp_path, signature=SIGNATURE) as url:
        host = url.split("://", 1)[1]
        shard = (
            f"http://user:{PASSWORD}@{host}/a.jsonl?X-Amz-Signature={SIGNATURE}"
            f"&X-Amz-Security-Token={HTTP_TOKEN}"
        )
        ds = Dataset.from_path("web", shard, format="jsonl")
        seen = [
            repr(ds),
            str(ds),
            repr(ds.shards),
            str(ds.shards),
            repr(ds.shards[0]),
            json.dumps(ds.location()),
        ]
        pipe = Pipeline(
            StaticMixtureWorkSource([ds], seed=3),
            rank=0,
            world_size=1,
            on_error="skip",
            provenance=True,
        )
        items = list(pipe)
        assert len(items) == 199 and items[0]["_provenance"]["shard"].endswith("=***")
        seen += [json.dumps(item["_provenance"]) for item in items[:3]]
        seen += [
            json.dumps(pipe.checkpoint()),
            json.dumps(pipe.stats(), default=str),
            pipe.explain(),
            repr(pipe),
        ]
        strict = Pipeline(StaticMixtureWorkSource([ds], seed=3), rank=0, world_size=1)
        with pytest.raises(ZephonError) as info:
            list(strict)
        seen += [str(info.value), repr(info.value), "".join(getattr(info.value, "__notes__", []))]
    seen += [r.getMessage() for r in caplog.records]
    leaked = [s for s in (PASSWORD, SIGNATURE, HTTP_TOKEN) if s in "\n".join(seen)]
    assert leaked == []

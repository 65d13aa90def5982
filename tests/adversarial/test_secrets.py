"""A secret in ``storage_options`` appears in no error, repr, log, stats, explain output or
checkpoint, on the paths a user sees."""

from __future__ import annotations

import json
import logging

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ZephonError
from zephon.storage import open_storage
from zephon.testing import S3Endpoint

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
    options = {"endpoint_url": s3_endpoint.endpoint_url, "key": KEY, "secret": SECRET,
               "token": TOKEN}  # fmt: skip
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
    seen += [json.dumps(pipe.checkpoint()), json.dumps(pipe.stats(), default=str),
             pipe.explain()]  # fmt: skip
    # Zephon's own logs. (botocore's DEBUG logs print signed request headers, the access key
    # id and session token included: that is botocore's, at a level users opt into.)
    seen += [r.getMessage() for r in caplog.records if r.name.startswith("zephon")]
    assert _leaks("\n".join(seen)) == []

"""Hand-signed S3 URLs: the same signature botocore makes from the same inputs, and the hand
signer used only where botocore's inputs are plain (static keys or none, a known endpoint or
an AWS region with nothing else configured)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import parse_qs, quote, urlsplit

import boto3
import pytest
from botocore.config import Config

from zephon.storage.s3_presigned import hand_signer
from zephon.storage.sigv4 import presign_get

KEYS = ["a/b.jsonl", "dir with space/ä+b~c=d&e.bin", "x//y/./z", "100%/(1)*'!.txt"]


ENDPOINTS = [
    ("http://127.0.0.1:9000", "us-east-1"),
    ("https://minio.example:9443/base", "eu-west-1"),
    (None, "ap-southeast-2"),  # AWS itself: virtual-hosted
]


@pytest.mark.parametrize("key", KEYS)
@pytest.mark.parametrize("token", [None, "FwoGZXIvYXdzE/abc+=="])
@pytest.mark.parametrize(("endpoint", "region"), ENDPOINTS)
def test_the_signature_is_botocores(
    key: str, token: str | None, endpoint: str | None, region: str
) -> None:
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name=region,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="wJalr/K7MDENG+bPxRfiCY=",
        aws_session_token=token,
        config=Config(
            signature_version="s3v4", s3={"addressing_style": "path" if endpoint else "virtual"}
        ),
    )
    theirs = client.generate_presigned_url(
        "get_object", Params={"Bucket": "my-bucket", "Key": key}, ExpiresIn=3600
    )
    query = parse_qs(urlsplit(theirs).query)
    now = datetime.strptime(query["X-Amz-Date"][0], "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    base = f"{endpoint}/my-bucket" if endpoint else f"https://my-bucket.s3.{region}.amazonaws.com"
    ours = presign_get(
        f"{base}/{quote(key, safe='/~')}",
        access_key="AKIDEXAMPLE",
        secret_key="wJalr/K7MDENG+bPxRfiCY=",
        token=token,
        region=region,
        expires_s=3600,
        now=now,
    )
    assert urlsplit(ours)[:3] == urlsplit(theirs)[:3]
    assert parse_qs(urlsplit(ours).query) == query


def _url(options: dict[str, object], environ: dict[str, str], bucket: str = "bk1") -> str | None:
    signer = hand_signer(options, environ)
    return None if signer is None else asyncio.run(signer.presign(bucket, "k/x y.bin"))


def test_plain_inputs_are_signed_by_hand(tmp_path: Path) -> None:
    no_config = {"AWS_CONFIG_FILE": str(tmp_path / "none")}
    keys = {"key": "AKIDEXAMPLE", "secret": "s3cret-value"}
    url = _url({**keys, "endpoint_url": "http://127.0.0.1:9000"}, no_config)
    assert url is not None and url.startswith("http://127.0.0.1:9000/bk1/k/x%20y.bin?")
    assert "us-east-1" in url and "X-Amz-Signature=" in url
    anon = _url({"anon": True, "endpoint_url": "http://h:1"}, no_config)
    assert anon == "http://h:1/bk1/k/x%20y.bin"  # nothing to sign
    env_keys = {
        **no_config,
        "AWS_ACCESS_KEY_ID": "AKIDENV",
        "AWS_SECRET_ACCESS_KEY": "env-secret",
        "AWS_SESSION_TOKEN": "tok",
        "AWS_ENDPOINT_URL": "http://e:2",
        "AWS_REGION": "eu-west-3",
    }
    url = _url({}, env_keys)
    assert url is not None and "AKIDENV%2F" in url and "eu-west-3" in url and "Token=tok" in url
    aws = _url(keys, {**no_config, "AWS_DEFAULT_REGION": "eu-central-1"})
    assert aws is not None and aws.startswith("https://bk1.s3.eu-central-1.amazonaws.com/k/")
    dotted = _url(keys, {**no_config, "AWS_DEFAULT_REGION": "eu-central-1"}, "my.bucket")
    assert dotted is not None and dotted.startswith("https://s3.eu-central-1.amazonaws.com/my.b")


def test_anything_else_is_left_to_botocore(tmp_path: Path) -> None:
    config = tmp_path / "config"
    config.write_text("[default]\nuse_fips_endpoint = true\n")
    plain = {"AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_DEFAULT_REGION": "us-west-2"}
    keys = {"key": "AKIDEXAMPLE", "secret": "s3cret-value"}
    assert _url({"profile": "dev", **keys}, plain) is None
    assert _url({**keys, "client_kwargs": {"verify": False}}, plain) is None
    assert _url(keys, {**plain, "AWS_PROFILE": "dev"}) is None
    expiring = {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}
    expiring["AWS_CREDENTIAL_EXPIRATION"] = "2030-01-01T00:00:00Z"
    assert _url({}, {**plain, **expiring}) is None
    assert _url({}, plain) is None  # credentials botocore must find (a role, a file...)
    assert _url(keys, {**plain, "AWS_CONFIG_FILE": str(config)}) is None
    assert _url(keys, {**plain, "AWS_USE_FIPS_ENDPOINT": "true"}) is None
    assert _url(keys, {"AWS_CONFIG_FILE": str(tmp_path / "none")}) is None  # no region
    assert _url(keys, {**plain, "AWS_DEFAULT_REGION": "cn-north-1"}) is None
    with_endpoint = {**keys, "endpoint_url": "http://h:1"}
    assert _url(with_endpoint, {"AWS_CONFIG_FILE": str(config)}) is None  # its region?
    assert _url(with_endpoint, {"AWS_CONFIG_FILE": str(config), "AWS_REGION": "x"}) is not None

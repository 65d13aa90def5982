from __future__ import annotations

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError

from zephon.errors import (
    AccessDenied,
    FormatError,
    NotFound,
    ObjectChanged,
    StorageError,
    Throttled,
    TransientStorageError,
    redact_uri,
)
from zephon.storage.http_status import error_for_status
from zephon.storage.s3 import S3Backend, translate_s3_error


def test_redact_uri_masks_secrets() -> None:
    uri = "https://user:hunter2@host/p/a.tar?X-Amz-Signature=abc123&X-Amz-Credential=AKIA&part=1"
    red = redact_uri(uri)
    assert "hunter2" not in red and "abc123" not in red and "AKIA" not in red
    assert red == "https://***@host/p/a.tar?X-Amz-Signature=***&X-Amz-Credential=***&part=1"
    assert redact_uri("/local/path.jsonl") == "/local/path.jsonl"


def test_storage_error_message_names_uri_status_and_code() -> None:
    err = StorageError("boom", uri="s3://b/k?token=secret", status=500, code="InternalError")
    assert str(err) == "boom: s3://b/k?token=*** (status 500, InternalError)"


def test_format_error_names_dataset_shard_and_sample() -> None:
    err = FormatError("line is not JSON", dataset="web", uri="s3://b/s.jsonl", sample=7)
    assert str(err) == "line is not JSON [dataset 'web', shard s3://b/s.jsonl, sample 7]"


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "GetObject",
    )


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("NoSuchKey", 404, NotFound),
        ("NoSuchBucket", 404, NotFound),
        ("AccessDenied", 403, AccessDenied),
        ("InvalidAccessKeyId", 403, AccessDenied),
        ("PreconditionFailed", 412, ObjectChanged),
        ("SlowDown", 503, Throttled),
        ("TooManyRequests", 429, Throttled),
        ("InternalError", 500, TransientStorageError),
        ("Weird", 502, TransientStorageError),
    ],
)
def test_s3_errors_translate_by_code_and_status(
    code: str, status: int, expected: type[Exception]
) -> None:
    err = translate_s3_error(_client_error(code, status), "s3://b/k")
    assert type(err) is expected
    assert "s3://b/k" in str(err)


def test_s3_connection_and_credential_errors() -> None:
    assert isinstance(
        translate_s3_error(EndpointConnectionError(endpoint_url="http://x"), "s3://b/k"),
        TransientStorageError,
    )
    assert isinstance(translate_s3_error(NoCredentialsError(), "s3://b/k"), AccessDenied)


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, NotFound),
        (403, AccessDenied),
        (412, ObjectChanged),
        (429, Throttled),
        (503, Throttled),
        (500, TransientStorageError),
        (400, StorageError),
    ],
)
def test_http_status_translation(status: int, expected: type[Exception]) -> None:
    assert type(error_for_status(status, "gs://b/k")) is expected


def test_backend_repr_never_shows_secrets() -> None:
    backend = S3Backend({"key": "AKIAEXAMPLE", "secret": "s3cr3t", "endpoint_url": "http://h"})
    assert "s3cr3t" not in repr(backend) and "AKIAEXAMPLE" not in repr(backend)

"""What the log scrubber masks: registered values anywhere, and the shapes secrets take in
the records of botocore, gcsfs, Azure's SDK and aiohttp."""

from __future__ import annotations

import logging

import pytest

from zephon.storage import logsecrets

CASES = [
    ("headers={'X-Amz-Security-Token': b'IQoJb3JpZ2luX2VjEFAKE', 'Host': 'h'}", "IQoJb3JpZ2lu"),
    ("x-amz-security-token:IQoJb3JpZ2luX2VjEFAKE\nhost:h", "IQoJb3JpZ2lu"),
    (
        "'Authorization': b'AWS4-HMAC-SHA256 Credential=AKIAFAKE/2026/s3, Signature=abc123'",
        "AKIAFAKE",
    ),
    ("GET https://b.s3.amazonaws.com/k?X-Amz-Signature=deadbeef99&X-Amz-Expires=60", "deadbeef99"),
    ("GET https://acct.blob.core.windows.net/c/b?sv=2024&sig=AbCdEfGh%2B123&se=x", "AbCdEfGh"),
    ("Authorization: Bearer ya29.a0AfH6SMBfakeTokenValue", "ya29.a0AfH6"),
    ("connect to https://user:hunter2secret@host:8080/path", "hunter2secret"),
]


@pytest.mark.parametrize(("text", "secret"), CASES)
def test_patterns_mask_secrets_and_keep_the_rest(text: str, secret: str) -> None:
    clean = logsecrets.scrub(text)
    assert secret not in clean and logsecrets.MASK in clean
    assert clean[:8] == text[:8]  # what is around a secret stays readable


def test_registered_values_are_masked_in_client_records_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logsecrets.install()
    logsecrets.register("plain-looking-value-42", "short")
    caplog.set_level(logging.DEBUG)
    logging.getLogger("botocore.endpoint").debug("using %s now", "plain-looking-value-42")
    logging.getLogger("someone.else").debug("using %s now", "plain-looking-value-42")
    by_name = {r.name: r.getMessage() for r in caplog.records}
    assert by_name["botocore.endpoint"] == "using *** now"
    assert by_name["someone.else"] == "using plain-looking-value-42 now"  # not ours to change
    assert logsecrets.scrub("short") == "short"  # too short to be a credential

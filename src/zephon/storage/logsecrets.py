"""Credentials kept out of log records: Zephon's and those of the clients it configures.

At DEBUG, botocore logs every signed request: its headers (``X-Amz-Security-Token``, the
``Authorization`` header with the access key id and signature) and the canonical request it
signed; gcsfs, Azure's SDK and aiohttp log headers and URLs of their own. A user who turns
on DEBUG to see why a read is slow should not paste their session token into a bug report.

Once a storage backend is opened, a log record factory scrubs the records of those loggers
(and Zephon's) as they are made: the values of the credentials Zephon was given or found
(:func:`register`), and whatever a pattern knows to be a secret (signatures, tokens and
authorization headers in headers, query strings and canonical requests, ``user:password@`` in
URLs). Records of other loggers are untouched, and nothing is done for a logger whose level
makes it drop the record (the factory runs only for records that are emitted).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

__all__ = ["install", "register", "scrub"]

MASK = "***"
_CLIENTS = ("zephon", "botocore", "aiobotocore", "s3fs", "gcsfs", "fsspec", "google", "azure",
            "aiohttp", "urllib3", "requests", "httpx", "huggingface_hub")  # fmt: skip
# Each: a prefix that is kept, then the secret (group "value") that is masked.
_PATTERNS = [
    # headers, as dict reprs or canonical-request lines: 'X-Amz-Security-Token': b'...'
    r"(?i)((?:x-amz-security-token|x-amz-signature|x-goog-signature|authorization|"
    r"x-ms-copy-source-authorization|cookie|x-api-key)['\"]?\s*[:=]\s*b?['\"]?)(?P<value>[^'\"\r\n]+)",
    # query strings and signed parameter lists: Signature=..., Credential=AKIA.../...
    r"(?i)((?:[?&,\s]|^)(?:x-amz-)?(?:signature|credential|security-token|sig|token|"
    r"access_token|code|key|password|secret)=)(?P<value>[^&\s,'\"]+)",
    # bearer and basic credentials
    r"(?i)(\b(?:bearer|basic)\s+)(?P<value>[A-Za-z0-9._~+/=-]{8,})",
    # user:password@host
    r"(?i)(\b[a-z][a-z0-9+.-]*://[^/\s:@'\"]*:)(?P<value>[^@/\s'\"]+)(?=@)",
]
_REGEX = [re.compile(p) for p in _PATTERNS]
_known: set[str] = set()
_lock = threading.Lock()
_installed = False


def register(*values: Any) -> None:
    """Mask these values (keys, secrets, tokens: strings of 8 characters or more) wherever
    they appear in a log record from now on."""
    found = {v for v in values if isinstance(v, str) and len(v) >= 8}
    if found - _known:
        with _lock:
            _known.update(found)


def scrub(text: str) -> str:
    """``text`` with every known credential and everything a pattern takes for one masked."""
    for value in sorted(_known, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    for regex in _REGEX:
        text = regex.sub(lambda m: m.group(1) + MASK, text)
    return text


def install() -> None:
    """Scrub the records of Zephon's and its clients' loggers from now on (once)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
        made = logging.getLogRecordFactory()

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = made(*args, **kwargs)
        if record.name.startswith(_CLIENTS):
            try:
                message = record.getMessage()
            except Exception:  # a record whose arguments do not format: logging reports it
                return record
            clean = scrub(message)
            if clean != message:
                record.msg, record.args = clean, None
        return record

    logging.setLogRecordFactory(factory)

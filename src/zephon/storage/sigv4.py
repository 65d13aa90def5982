"""Presigned S3 GET URLs (AWS Signature Version 4, query parameters) without botocore.

Importing botocore and building a client costs a fresh process about 0.15 s before its first
byte; a URL signed here costs microseconds. Used only where the signature's inputs are plain:
static keys (or none: anonymous) and an endpoint known without botocore's rules (see
:func:`zephon.storage.s3_presigned.direct_presigner`); everything else is signed by botocore.
The algorithm is AWS's published one: a canonical request of the method, path, sorted query
and the ``host`` header, hashed into a string to sign, signed with a key derived from the
secret, the date, the region and the service.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from datetime import UTC, datetime
from urllib.parse import quote, urlsplit

__all__ = ["presign_get"]

_ALGORITHM = "AWS4-HMAC-SHA256"


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def presign_get(
    url: str,
    *,
    access_key: str,
    secret_key: str,
    token: str | None,
    region: str,
    expires_s: int,
    query: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> str:
    """``url`` (its path already percent-encoded, no query) with ``query`` signed for a GET
    by anyone holding it for ``expires_s`` seconds from ``now``."""
    now = (now or datetime.now(UTC)).astimezone(UTC)
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    scope = f"{day}/{region}/s3/aws4_request"
    parts = urlsplit(url)
    params = {
        **(query or {}),
        "X-Amz-Algorithm": _ALGORITHM,
        "X-Amz-Credential": f"{access_key}/{scope}",
        "X-Amz-Date": stamp,
        "X-Amz-Expires": str(expires_s),
        "X-Amz-SignedHeaders": "host",
    }
    if token:
        params["X-Amz-Security-Token"] = token
    query_string = "&".join(
        f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(params.items())
    )
    canonical = "\n".join(
        [
            "GET",
            parts.path or "/",
            query_string,
            f"host:{parts.netloc}\n",
            "host",
            "UNSIGNED-PAYLOAD",
        ]
    )
    to_sign = "\n".join([_ALGORITHM, stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(("AWS4" + secret_key).encode(), day)
    for part in (region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"{parts.scheme}://{parts.netloc}{parts.path}?{query_string}&X-Amz-Signature={signature}"

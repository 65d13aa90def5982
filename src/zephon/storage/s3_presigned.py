"""S3 ranged reads over presigned URLs: the hot path of :class:`~zephon.storage.s3.S3Backend`.

A ranged GET through botocore builds, signs and parses a whole API call: ~1.4 ms of CPU on the
event loop against ~0.5 ms for the same GET through aiohttp, and the loop thread is what a
main-process loader runs out of. So an object is presigned once (by botocore, with the
client's credentials, endpoint and addressing) and its reads go through aiohttp with
``Range`` and ``If-Match`` headers, which a presigned URL leaves unsigned.

A URL is reused for :data:`URL_TTL_S`, well inside the ten minutes before expiry at which
botocore refreshes temporary credentials, so a cached URL never outlives the token it was
signed with. An answer this path does not know what to do with (403: a key rotated or a
token revoked; 301/307: a bucket in another region; 400; an error without S3's error
document, as a proxy sends) drops the URL and goes back to botocore, whose call refreshes
credentials, follows region redirects and names the error; successes and the S3 errors
whose meaning is plain (404, 412, 416, throttling, server errors) never leave this path.
"""

from __future__ import annotations

import os
import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from zephon.errors import NotFound
from zephon.refs import ObjectInfo
from zephon.storage.http import HTTPBackend, range_headers, ranged_answer
from zephon.storage.http_status import error_for_status, total_from_content_range
from zephon.storage.sigv4 import presign_get

__all__ = [
    "EXPIRES_S",
    "URL_TTL_S",
    "HandSigner",
    "PresignedReads",
    "code_of",
    "environment_keys",
    "hand_signer",
]

URL_TTL_S = 300.0  # a URL is reused this long (signed for EXPIRES_S)
EXPIRES_S = 3600
MAX_URLS = 4096  # objects whose URL is kept, the least recently used dropped first
_PLAIN = frozenset({404, 410, 412, 429}) | frozenset(range(500, 600))  # said here
_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")

# AWS's commercial and GovCloud regions (China and isolated partitions: botocore's rules).
_AWS_REGION = re.compile(r"(?:us|eu|ap|sa|ca|me|af|il|mx)(?:-gov)?-[a-z]+-\d{1,2}")
_DNS_BUCKET = re.compile(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
_ENDPOINT_SETTINGS = (
    "AWS_USE_FIPS_ENDPOINT",
    "AWS_USE_DUALSTACK_ENDPOINT",
    "AWS_S3_USE_ARN_REGION",
    "AWS_S3_DISABLE_MULTIREGION_ACCESS_POINTS",
)

Presign = Callable[[str, str], Awaitable[str]]


class PresignedReads:
    """Ranged GETs of ``s3://`` objects through ``http`` at URLs that ``presign`` makes.

    Args:
        presign: ``(bucket, key) -> URL``, a GET URL valid for :data:`EXPIRES_S`.
        http: the aiohttp client the reads go through.
        fallback: the presigner of a bucket once one of ``presign``'s URLs was refused
            (``presign`` signs by hand; ``fallback`` asks botocore, whose rules know more).
        clock: seconds, monotonic (a test's fake clock).
    """

    def __init__(
        self,
        presign: Presign,
        http: HTTPBackend,
        fallback: Presign | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._presign = presign
        self._fallback = fallback
        self.http = http
        self._clock = clock
        self._urls: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self._refused: set[str] = set()  # buckets signed by the fallback from now on
        self.presigned = 0  # URLs made, for tests and stats

    def __repr__(self) -> str:
        return f"PresignedReads(urls={len(self._urls)})"  # never the URLs: they are signed

    async def _url(self, bucket: str, key: str) -> str:
        now = self._clock()
        kept = self._urls.get((bucket, key))
        if kept is not None and now < kept[1]:
            self._urls.move_to_end((bucket, key))
            return kept[0]
        presign = self._presign
        if self._fallback is not None and bucket in self._refused:
            presign = self._fallback
        url = await presign(bucket, key)
        self.presigned += 1
        self._urls[(bucket, key)] = (url, now + URL_TTL_S)
        self._urls.move_to_end((bucket, key))
        while len(self._urls) > MAX_URLS:
            self._urls.popitem(last=False)
        return url

    async def get_range(
        self, uri: str, bucket: str, key: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int] | None:
        """Bytes ``[start, stop)`` of ``uri`` and the object's size, or ``None`` when the
        answer is one for botocore to repeat and explain (the URL is then dropped)."""
        url = await self._url(bucket, key)
        headers = range_headers(start, stop, version)
        status, answer, body = await self.http.request("GET", url, headers, uri=uri)
        if status in (200, 206, 416):
            return ranged_answer(status, answer, body, start, stop, version, uri)
        self._refuse_or_raise(status, body, uri, bucket, key)
        return None

    async def stat(self, uri: str, bucket: str, key: str) -> ObjectInfo | None:
        """Size and version of ``uri`` from a GET of its first byte (a presigned URL is
        signed for GET, not HEAD); ``None`` for botocore to answer: an empty object (S3
        refuses a range of it) or an answer this path does not explain."""
        url = await self._url(bucket, key)
        headers = {"Range": "bytes=0-0", "Accept-Encoding": "identity"}
        status, answer, body = await self.http.request("GET", url, headers, uri=uri)
        etag = answer.get("ETag")
        if status == 206 and etag:
            size = total_from_content_range(answer.get("Content-Range"))
            return ObjectInfo(uri, size, str(etag)) if size is not None else None
        if status == 200 and etag and answer.get("Content-Length") is not None:
            return ObjectInfo(uri, int(answer["Content-Length"]), str(etag))
        if status not in (200, 206, 416):
            self._refuse_or_raise(status, body, uri, bucket, key)
        return None

    def _refuse_or_raise(self, status: int, body: bytes, uri: str, bucket: str, key: str) -> None:
        """Raise the error an answer is; or, for one botocore is to repeat and explain, drop
        the URL and sign for the bucket by the fallback from now on."""
        code = code_of(body)
        if code is None or status not in _PLAIN:
            self._urls.pop((bucket, key), None)
            self._refused.add(bucket)
            return
        if status in (404, 410):
            raise NotFound("no such object or bucket", uri=uri, status=status, code=code)
        raise error_for_status(status, uri, code=code)

    async def aclose(self) -> None:
        self._urls.clear()
        await self.http.aclose()


def code_of(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document (``SlowDown``, ``NoSuchKey``...), if any."""
    match = _CODE.search(body[:4096])
    return match.group(1).decode() if match else None


@dataclass(frozen=True)
class HandSigner:
    """URLs of one S3 endpoint signed by hand (:mod:`zephon.storage.sigv4`): an object's GET
    and a bucket's listing. ``keys`` is ``None`` for anonymous access (nothing signed)."""

    keys: tuple[str, str, str | None] | None
    region: str
    endpoint: str | None  # path-style under it; ``None``: AWS's own host names

    def __repr__(self) -> str:
        return f"HandSigner(region={self.region!r}, endpoint={self.endpoint!r})"  # no keys

    def _base(self, bucket: str) -> str:
        if self.endpoint is not None:
            return f"{self.endpoint}/{bucket}"
        if _DNS_BUCKET.fullmatch(bucket):  # else a legacy name: path-style (dots break TLS)
            return f"https://{bucket}.s3.{self.region}.amazonaws.com"
        return f"https://s3.{self.region}.amazonaws.com/{bucket}"

    def _sign(self, url: str, query: Mapping[str, str] | None = None) -> str:
        if self.keys is None:
            return url + ("?" + urlencode(query, quote_via=quote) if query else "")
        access, secret, token = self.keys
        return presign_get(
            url,
            access_key=access,
            secret_key=secret,
            token=token,
            region=self.region,
            expires_s=EXPIRES_S,
            query=query,
        )

    async def presign(self, bucket: str, key: str) -> str:
        """A GET URL of ``bucket``/``key`` (a :data:`Presign`)."""
        return self._sign(f"{self._base(bucket)}/{quote(key, safe='/~')}")

    def list_url(self, bucket: str, query: Mapping[str, str]) -> str:
        """A GET URL of ``bucket``'s listing (ListObjectsV2) with ``query``."""
        base = self._base(bucket)
        return self._sign(base if self.endpoint is not None else base + "/", query)


def hand_signer(
    options: Mapping[str, Any], environ: Mapping[str, str] = os.environ
) -> HandSigner | None:
    """A signer by hand where what botocore would sign with is plain; ``None`` where it is
    not (botocore then signs).

    Plain means: static keys (``key``/``secret``/``token`` given, or in ``AWS_ACCESS_KEY_ID``
    and ``AWS_SECRET_ACCESS_KEY`` without a profile or an expiry) or ``anon``; no
    ``client_kwargs``; and either an endpoint (``endpoint_url``, ``AWS_ENDPOINT_URL_S3``,
    ``AWS_ENDPOINT_URL``), read path-style, or AWS itself in a region named by ``region_name``,
    ``AWS_REGION`` or ``AWS_DEFAULT_REGION`` with no AWS config file and no endpoint setting
    in the environment (FIPS, dual-stack...) that botocore would apply.
    """
    if options.get("profile") or options.get("client_kwargs") or environ.get("AWS_PROFILE"):
        return None
    keys: tuple[str, str, str | None] | None = None
    if options.get("key") and options.get("secret"):
        keys = (options["key"], options["secret"], options.get("token"))
    elif not options.get("anon"):
        found = environment_keys(environ)
        if found is None:
            return None
        keys = found
    region = options.get("region_name") or environ.get("AWS_REGION")
    region = region or environ.get("AWS_DEFAULT_REGION")
    configured = _config_file(environ).is_file()
    endpoint = options.get("endpoint_url")
    if not endpoint and not environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS"):
        endpoint = environ.get("AWS_ENDPOINT_URL_S3") or environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        if not region and configured:  # the file may name the region to sign for
            return None
        return HandSigner(keys, region or "us-east-1", str(endpoint).rstrip("/"))
    if not region or not _AWS_REGION.fullmatch(region) or configured:
        return None
    if any(environ.get(name) for name in _ENDPOINT_SETTINGS):
        return None
    return HandSigner(keys, region, None)


def environment_keys(environ: Mapping[str, str]) -> tuple[str, str, str | None] | None:
    """Static keys from the environment, as botocore would take them first; ``None`` where
    they may expire (botocore refreshes those) or are absent."""
    if environ.get("AWS_CREDENTIAL_EXPIRATION"):
        return None
    key, secret = environ.get("AWS_ACCESS_KEY_ID"), environ.get("AWS_SECRET_ACCESS_KEY")
    if not key or not secret:
        return None
    return key, secret, environ.get("AWS_SESSION_TOKEN") or None


def _config_file(environ: Mapping[str, str]) -> Path:
    return Path(environ.get("AWS_CONFIG_FILE") or Path.home() / ".aws" / "config").expanduser()

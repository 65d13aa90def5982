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

import re
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from zephon.errors import NotFound
from zephon.storage.http import HTTPBackend, range_headers, ranged_answer
from zephon.storage.http_status import error_for_status

__all__ = ["URL_TTL_S", "PresignedReads", "presigner"]

URL_TTL_S = 300.0  # a URL is reused this long (signed for EXPIRES_S)
EXPIRES_S = 3600
MAX_URLS = 4096  # objects whose URL is kept, the least recently used dropped first
_PLAIN = frozenset({404, 410, 412, 429}) | frozenset(range(500, 600))  # said here
_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,64})</Code>")

Presign = Callable[[str, str], Awaitable[str]]


class PresignedReads:
    """Ranged GETs of ``s3://`` objects through ``http`` at URLs that ``presign`` makes.

    Args:
        presign: ``(bucket, key) -> URL``, a GET URL valid for :data:`EXPIRES_S`.
        http: the aiohttp client the reads go through.
        clock: seconds, monotonic (a test's fake clock).
    """

    def __init__(
        self, presign: Presign, http: HTTPBackend, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._presign = presign
        self._http = http
        self._clock = clock
        self._urls: OrderedDict[tuple[str, str], tuple[str, float]] = OrderedDict()
        self.presigned = 0  # URLs made, for tests and stats

    def __repr__(self) -> str:
        return f"PresignedReads(urls={len(self._urls)})"  # never the URLs: they are signed

    async def _url(self, bucket: str, key: str) -> str:
        now = self._clock()
        kept = self._urls.get((bucket, key))
        if kept is not None and now < kept[1]:
            self._urls.move_to_end((bucket, key))
            return kept[0]
        url = await self._presign(bucket, key)
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
        status, answer, body = await self._http.request("GET", url, headers, uri=uri)
        if status in (200, 206, 416):
            return ranged_answer(status, answer, body, start, stop, version, uri)
        code = _code_of(body)
        if code is None or status not in _PLAIN:
            self._urls.pop((bucket, key), None)
            return None
        if status in (404, 410):
            raise NotFound("no such object or bucket", uri=uri, status=status, code=code)
        raise error_for_status(status, uri, code=code)

    async def aclose(self) -> None:
        self._urls.clear()
        await self._http.aclose()


def _code_of(body: bytes) -> str | None:
    """The ``<Code>`` of an S3 error document (``SlowDown``, ``NoSuchKey``...), if any."""
    match = _CODE.search(body[:4096])
    return match.group(1).decode() if match else None


def presigner(client: Any) -> Presign:
    """``(bucket, key) -> URL`` through ``client``'s signer (its credentials, refreshed as
    botocore refreshes them, its endpoint and addressing style)."""

    async def presign(bucket: str, key: str) -> str:
        url: str = await client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES_S
        )
        return url

    return presign

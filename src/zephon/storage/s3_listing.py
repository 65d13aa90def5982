"""S3 listings (ListObjectsV2) at hand-signed URLs through aiohttp.

Where the S3 backend signs by hand (:class:`~zephon.storage.s3_presigned.HandSigner`), a
listing is one GET of the bucket with ``list-type=2`` and its XML answer read here, so a
process that lists a prefix and reads its objects never imports botocore. Keys come
URL-encoded (``encoding-type=url``: characters XML cannot carry survive) and are decoded as
botocore decodes them. An answer this path does not know (a refused signature, a redirect,
an error without S3's error document, a body that does not parse) is handed back (``None``)
for botocore to list.
"""

from __future__ import annotations

from urllib.parse import unquote_plus
from xml.etree import ElementTree

from zephon.errors import NotFound
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http import HTTPBackend
from zephon.storage.http_status import error_for_status
from zephon.storage.s3_presigned import HandSigner, code_of

__all__ = ["list_signed", "parse_listing"]

_RETRIED = frozenset({429}) | frozenset(range(500, 600))  # S3's own: said as they are


async def list_signed(
    http: HTTPBackend, signer: HandSigner, bucket: str, prefix: str, token: str | None
) -> ListPage | None:
    """One page (up to 1,000 objects) of ``s3://bucket/prefix``; ``None``: ask botocore."""
    query = {"list-type": "2", "prefix": prefix, "max-keys": "1000", "encoding-type": "url"}
    if token:
        query["continuation-token"] = token
    uri = f"s3://{bucket}/{prefix}"
    status, _, body = await http.request("GET", signer.list_url(bucket, query), {}, uri=uri)
    if status == 200:
        try:
            return parse_listing(body, bucket)
        except (ElementTree.ParseError, ValueError):
            return None
    code = code_of(body)
    if status == 404 and code == "NoSuchBucket":
        raise NotFound("no such object or bucket", uri=uri, status=status, code=code)
    if code is not None and status in _RETRIED:
        raise error_for_status(status, uri, code=code)
    return None


def parse_listing(body: bytes, bucket: str) -> ListPage:
    """The objects of a ListObjectsV2 answer (``encoding-type=url``) and the next page's
    token; "directory" keys (ending in ``/``) left out, as botocore's path does."""
    root = ElementTree.fromstring(body)
    infos, truncated, token = [], False, None
    for node in root:
        tag = node.tag.rsplit("}", 1)[-1]
        if tag == "Contents":
            fields = {child.tag.rsplit("}", 1)[-1]: child.text or "" for child in node}
            key = unquote_plus(fields["Key"])
            if not key.endswith("/"):
                infos.append(
                    ObjectInfo(f"s3://{bucket}/{key}", int(fields["Size"]), fields["ETag"])
                )
        elif tag == "IsTruncated":
            truncated = (node.text or "").strip() == "true"
        elif tag == "NextContinuationToken":
            token = node.text
    if truncated and not token:
        raise ValueError("a truncated listing without a continuation token")
    return infos, token if truncated else None

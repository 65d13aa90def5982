"""The presigned-URL cache of S3 reads: a URL is reused until its time is up, the least
recently used are dropped past the bound, and an error without S3's error document is handed
back (``None``) for botocore to repeat, that bucket signed by the fallback from then on.
Served by a real HTTP server; the clock is a test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon.storage import s3_presigned
from zephon.storage.http import HTTPBackend
from zephon.storage.s3_listing import parse_listing
from zephon.storage.s3_presigned import URL_TTL_S, PresignedReads
from zephon.testing import StaticHTTPServer

DATA = bytes(range(256))


async def test_a_url_is_reused_until_its_time_is_up(tmp_path: Path) -> None:
    (tmp_path / "a.bin").write_bytes(DATA)
    now, signed = [0.0], []
    with StaticHTTPServer(tmp_path) as url:

        async def presign(bucket: str, key: str) -> str:
            signed.append(key)
            return f"{url}/{key}"

        reads = PresignedReads(presign, HTTPBackend(), clock=lambda: now[0])
        assert await reads.get_range("s3://b/a.bin", "b", "a.bin", 3, 6, None) == (DATA[3:6], 256)
        now[0] = URL_TTL_S - 1
        assert await reads.get_range("s3://b/a.bin", "b", "a.bin", 250, 300, None) == (
            DATA[250:],
            256,
        )
        assert signed == ["a.bin"]
        now[0] = URL_TTL_S + 0.5
        await reads.get_range("s3://b/a.bin", "b", "a.bin", 0, 1, None)
        assert signed == ["a.bin", "a.bin"] and reads.presigned == 2
        assert "a.bin" not in repr(reads) and url not in repr(reads)
        await reads.aclose()


async def test_the_least_recently_used_urls_are_dropped_past_the_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_presigned, "MAX_URLS", 2)
    for name in "abc":
        (tmp_path / name).write_bytes(DATA)
    signed: list[str] = []
    with StaticHTTPServer(tmp_path) as url:

        async def presign(bucket: str, key: str) -> str:
            signed.append(key)
            return f"{url}/{key}"

        reads = PresignedReads(presign, HTTPBackend())
        for key in "abacab":
            assert await reads.get_range(f"s3://b/{key}", "b", key, 1, 2, None) == (DATA[1:2], 256)
        # a, b, a (kept), c (drops b), a (kept), b (signed again, drops c)
        assert signed == ["a", "b", "c", "b"]
        await reads.aclose()


async def test_an_error_without_an_s3_document_is_handed_back(tmp_path: Path) -> None:
    signed: list[str] = []
    with StaticHTTPServer(tmp_path) as url:

        async def presign(bucket: str, key: str) -> str:
            signed.append(key)
            return f"{url}/{key}"

        async def fallback(bucket: str, key: str) -> str:
            signed.append("fallback:" + key)
            return f"{url}/{key}"

        reads = PresignedReads(presign, HTTPBackend(), fallback=fallback)
        assert await reads.get_range("s3://b/none", "b", "none", 0, 10, None) is None
        assert await reads.get_range("s3://b/none", "b", "none", 0, 10, None) is None
        # the URL was dropped, and the bucket's next URLs come from the fallback signer
        assert signed == ["none", "fallback:none"]
        assert await reads.get_range("s3://c/none", "c", "none", 0, 10, None) is None
        assert signed[-1] == "none"  # another bucket: still signed by the first
        await reads.aclose()


LISTING = b"""<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
<Name>bk</Name><Prefix>p%2F</Prefix><KeyCount>3</KeyCount><MaxKeys>1000</MaxKeys>
<EncodingType>url</EncodingType><IsTruncated>true</IsTruncated>
<Contents><Key>p%2Fa+b.bin</Key><Size>7</Size><ETag>&quot;e1&quot;</ETag></Contents>
<Contents><Key>p%2Fdir%2F</Key><Size>0</Size><ETag>&quot;e2&quot;</ETag></Contents>
<Contents><Key>p%2F%C3%A4%09.bin</Key><Size>9</Size><ETag>&quot;e3&quot;</ETag></Contents>
<NextContinuationToken>tok/en+=</NextContinuationToken>
</ListBucketResult>"""


def test_a_listing_answer_is_read_as_botocore_reads_it() -> None:
    infos, token = parse_listing(LISTING, "bk")
    assert [(i.uri, i.size_bytes, i.version) for i in infos] == [
        ("s3://bk/p/a b.bin", 7, '"e1"'),
        ("s3://bk/p/\u00e4\t.bin", 9, '"e3"'),
    ]
    assert token == "tok/en+="
    last, token = parse_listing(LISTING.replace(b"<IsTruncated>true", b"<IsTruncated>false"), "bk")
    assert token is None and len(last) == 2
    with pytest.raises(ValueError, match="continuation"):
        parse_listing(
            LISTING.replace(b"<NextContinuationToken>tok/en+=</NextContinuationToken>", b""), "bk"
        )

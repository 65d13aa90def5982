"""S3 ranged reads go over presigned URLs through aiohttp, one URL per object; what that path
cannot explain (a refused signature, an error without S3's error document) is read again
through botocore, and plain S3 errors keep their meaning, code and one request each."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator

import pytest

from zephon.errors import NotFound, ObjectChanged, Throttled, Unreachable
from zephon.storage import RetryPolicy, open_storage
from zephon.testing import S3Endpoint
from zephon.testing.faults import FaultProxy, Faults

pytestmark = pytest.mark.integration

PAYLOAD = bytes(i % 251 for i in range(200_000))
ONCE = RetryPolicy(max_attempts=1)
KEY, SECRET = "AKIAPRESIGNEDTEST0001", "presigned/Secret+DoNotLeak=42"


@pytest.fixture
def objects(s3_endpoint: S3Endpoint, s3_bucket: str) -> list[str]:
    client = s3_endpoint.client()
    for name in ("a", "b"):
        client.put_object(Bucket=s3_bucket, Key=f"p/{name}", Body=PAYLOAD)
    return [f"s3://{s3_bucket}/p/{name}" for name in ("a", "b")]


@pytest.fixture
def proxy(s3_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    if S3Endpoint.from_env() is not None:
        pytest.skip("the proxy's presigned URLs are signed for moto's endpoint")
    with FaultProxy(s3_endpoint.endpoint_url, Faults()) as running:
        yield running


def _options(s3_endpoint: S3Endpoint, proxy: FaultProxy) -> dict[str, object]:
    return {**s3_endpoint.storage_options(proxy.url), "key": KEY, "secret": SECRET}


async def test_reads_are_presigned_gets_that_name_no_secret(
    s3_endpoint: S3Endpoint, objects: list[str], proxy: FaultProxy
) -> None:
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        info = await st.stat(objects[0])
        before = proxy.served["requests"]
        for i in range(10):
            uri = objects[i % 2]
            start = i * 9_000
            assert await st.read(uri, start, start + 5_000) == PAYLOAD[start : start + 5_000]
        assert await st.read(objects[0], 199_990, 200_000, version=info.version) == PAYLOAD[-10:]
        assert proxy.served["requests"] - before == 11  # the stat was one more, presigned too
        assert proxy.served["presigned"] == proxy.served["requests"] == 12
        with pytest.raises(NotFound) as missing:  # S3's answer, as it said it: one request
            await st.read(objects[0] + "-missing", 0, 10)
        assert missing.value.code == "NoSuchKey" and proxy.served["requests"] - before == 12
        proxy.stop()
        with pytest.raises(Unreachable) as gone:
            await st.read(objects[1], 0, 10)
    shown = str(gone.value) + repr(gone.value) + str(missing.value) + repr(st)
    assert KEY not in shown and SECRET not in shown and "Signature" not in shown
    assert "is endpoint_url" in str(gone.value)


@pytest.mark.parametrize("status", [403, 400, 502])
async def test_what_the_fast_path_cannot_explain_is_read_through_botocore(
    s3_endpoint: S3Endpoint, objects: list[str], proxy: FaultProxy, status: int
) -> None:
    """A refused signature (a key rotated, a token revoked), a bad request, or an error
    without S3's error document (a proxy's): botocore signs the request itself and reads."""
    proxy.faults = Faults(refuse_presigned=status)
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        for i in range(4):
            assert await st.read(objects[i % 2], 100, 300) == PAYLOAD[100:300]
    assert proxy.injected["refused"] == 4 == proxy.served["presigned"]
    assert proxy.served["requests"] == 8  # each read once more, header-signed


async def test_throttling_keeps_its_code_and_is_not_sent_twice(
    s3_endpoint: S3Endpoint, objects: list[str], proxy: FaultProxy
) -> None:
    proxy.faults = Faults(throttle_rate=1.0)
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        with pytest.raises(Throttled) as info:  # one attempt of the backend (the storage
            await st.backend.get_range(objects[0], 0, 10, None)  # waits throttling out)
    assert info.value.code == "SlowDown" and proxy.served["requests"] == 1


async def test_an_object_replaced_under_a_pinned_version_is_object_changed(
    s3_endpoint: S3Endpoint, s3_bucket: str, objects: list[str], proxy: FaultProxy
) -> None:
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        info = await st.stat(objects[0])
        assert await st.read(objects[0], 0, 4, version=info.version) == PAYLOAD[:4]
        s3_endpoint.client().put_object(Bucket=s3_bucket, Key="p/a", Body=b"new bytes")
        with pytest.raises(ObjectChanged):
            await st.read(objects[0], 0, 4, version=info.version)


def test_reads_with_static_keys_load_no_botocore(
    s3_endpoint: S3Endpoint, objects: list[str]
) -> None:
    """A fresh process listing, statting and reading with static keys signs by hand:
    botocore is never imported (0.1-0.15 s of a process's start), and the answers are the
    object's."""
    script = (
        "import asyncio, json, sys\n"
        "from zephon.storage import open_storage\n"
        "async def main():\n"
        f"    async with open_storage('s3://', {s3_endpoint.storage_options()!r}) as st:\n"
        f"        listed = [i.uri async for i in st.list({objects[0][:-1]!r})]\n"
        f"        size = (await st.stat({objects[0]!r})).size_bytes\n"
        f"        return listed, size, await st.read({objects[0]!r}, 10, 20)\n"
        "listed, size, data = asyncio.run(main())\n"
        "print(json.dumps([listed, size, list(data), 'botocore' in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    listed, size, data, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert listed == objects and size == len(PAYLOAD)
    assert bytes(data) == PAYLOAD[10:20] and loaded is False


NAMES = ["plain.bin", "with space.bin", "plus+sign.bin", "ünïcode/ä.bin", "tab\tand%.bin", "dir/"]


@pytest.mark.parametrize("refuse", [0, 403])
async def test_a_listing_signed_by_hand_is_botocores(
    s3_endpoint: S3Endpoint, s3_bucket: str, proxy: FaultProxy, refuse: int
) -> None:
    """Keys of every kind of character listed by hand as botocore lists them ("directory"
    keys left out); a refused hand-signed listing is listed by botocore instead."""
    client = s3_endpoint.client()
    for name in NAMES:
        client.put_object(Bucket=s3_bucket, Key=f"odd/{name}", Body=name.encode())
    want = sorted(f"s3://{s3_bucket}/odd/{n}" for n in NAMES if not n.endswith("/"))
    proxy.faults = Faults(refuse_presigned=refuse)
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        infos = [i async for i in st.list(f"s3://{s3_bucket}/odd/")]
        assert sorted(i.uri for i in infos) == want
        sizes = {i.uri.rsplit("/", 1)[1]: i.size_bytes for i in infos}
        assert sizes["with space.bin"] == len(b"with space.bin")
        assert all(i.version.startswith('"') for i in infos)  # ETags, quoted as botocore's
        again = [i async for i in st.list(f"s3://{s3_bucket}/odd/")]
    assert again == infos
    assert proxy.injected["refused"] == (1 if refuse else 0)  # then botocore for good


@pytest.mark.parametrize("refuse", [0, 403])
async def test_a_stat_signed_by_hand_is_botocores_head(
    s3_endpoint: S3Endpoint, s3_bucket: str, proxy: FaultProxy, refuse: int
) -> None:
    """Size and ETag from a hand-signed GET of the first byte equal botocore's HEAD, for keys
    of every kind of character; an empty object (no range to read) and a refused URL are
    answered by botocore; a missing object is NotFound either way."""
    client = s3_endpoint.client()
    names = [n for n in NAMES if not n.endswith("/")] + ["empty.bin"]
    for name in names:
        body = b"" if name == "empty.bin" else name.encode() * 7
        client.put_object(Bucket=s3_bucket, Key=f"stat/{name}", Body=body)
    proxy.faults = Faults(refuse_presigned=refuse)
    async with open_storage("s3://", _options(s3_endpoint, proxy), retry=ONCE) as st:
        for name in names:
            info = await st.stat(f"s3://{s3_bucket}/stat/{name}")
            head = client.head_object(Bucket=s3_bucket, Key=f"stat/{name}")
            assert (info.size_bytes, info.version) == (head["ContentLength"], head["ETag"])
        with pytest.raises(NotFound):
            await st.stat(f"s3://{s3_bucket}/stat/missing.bin")
    assert proxy.served["presigned"] >= (1 if refuse else len(names))


async def test_proxies_from_the_environment_and_no_proxy(
    s3_endpoint: S3Endpoint,
    objects: list[str],
    proxy: FaultProxy,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``HTTP_PROXY`` carries the listing, stat and read (as botocore's proxies setting
    would), ``NO_PROXY`` exempts the host; looked up once per host, never ``~/.netrc``."""
    monkeypatch.setenv("HTTP_PROXY", proxy.url)
    options = s3_endpoint.storage_options()  # the server itself: only a proxy could count

    async def use() -> bytes:
        async with open_storage("s3://", options, retry=ONCE) as st:
            assert [i.uri async for i in st.list(objects[0][:-1])] == objects
            assert (await st.stat(objects[0])).size_bytes == len(PAYLOAD)
            return await st.read(objects[1], 5, 15)

    assert await use() == PAYLOAD[5:15]
    assert proxy.served["requests"] == 3
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    assert await use() == PAYLOAD[5:15]
    assert proxy.served["requests"] == 3

"""Storage faults as users meet them, through real servers: a private bucket read
anonymously, an unknown key, a wrong or forgotten endpoint, an endpoint lost mid-run, an
object rewritten while a pass reads it, throttling that never ends, and flaky connections.
Each ends in one typed error naming the object (never an ExceptionGroup), or in the exact
output of a clean run."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import AccessDenied, ObjectChanged, Throttled, Unreachable
from zephon.storage import RetryPolicy, open_storage
from zephon.testing import FaultProxy, Faults, MotoServer, S3Endpoint

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

FAST = RetryPolicy(max_attempts=6, base_delay_s=0.001, max_delay_s=0.01, throttle_timeout_s=1.0)


def jsonl(ids: range) -> bytes:
    return b"".join(json.dumps({"id": i, "text": "t" * 60}).encode() + b"\n" for i in ids)


@pytest.fixture
def shards(s3_endpoint: S3Endpoint, s3_bucket: str) -> str:
    client = s3_endpoint.client()
    for s in range(3):
        client.put_object(
            Bucket=s3_bucket, Key=f"d/part-{s}.jsonl", Body=jsonl(range(s * 400, (s + 1) * 400))
        )
    return f"s3://{s3_bucket}/d/"


@pytest.fixture
def proxy(s3_endpoint: S3Endpoint, request: pytest.FixtureRequest) -> Iterator[FaultProxy]:
    faults = getattr(request, "param", Faults())
    with FaultProxy(s3_endpoint.endpoint_url, faults) as p:
        yield p


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("proxy", [Faults(deny_anonymous=True)], indirect=True)
async def test_an_anonymous_client_of_a_private_bucket_gets_access_denied(
    shards: str, proxy: FaultProxy
) -> None:
    with pytest.raises(AccessDenied, match="access denied") as info:
        await Dataset.afrom_path(
            "d", shards, storage_options={"endpoint_url": proxy.url, "anon": True}
        )
    assert shards in str(info.value) and proxy.injected["denied"] > 0
    with pytest.raises(AccessDenied):  # the sync door too
        Dataset.from_path("d", shards, storage_options={"endpoint_url": proxy.url, "anon": True})


def test_an_unknown_key_is_access_denied_and_the_secret_is_never_shown() -> None:
    with MotoServer(enforce_auth=True) as endpoint:
        options = {**endpoint.storage_options(), "key": "AKIAUNKNOWN", "secret": "s3cr3t-VALUE"}
        with pytest.raises(AccessDenied) as info:
            Dataset.from_path("d", "s3://private-bucket/d/", storage_options=options)
    shown = str(info.value) + repr(info.value) + "".join(getattr(info.value, "__notes__", []))
    assert "s3://private-bucket/d/" in shown and "s3cr3t-VALUE" not in shown


async def test_an_endpoint_never_reached_fails_after_a_few_quick_attempts() -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    options = {"endpoint_url": url, "key": "k", "secret": "s"}
    retry = RetryPolicy(max_attempts=10, base_delay_s=0.001, max_delay_s=0.01)
    async with open_storage("s3://", options, retry=retry) as storage:
        with pytest.raises(Unreachable, match=r"127\.0\.0\.1") as info:
            await storage.stat("s3://bucket/key")
        assert storage.stats.retries == 2  # three attempts, not ten
    assert "gave up after 3 attempts" in "".join(info.value.__notes__)
    with pytest.raises(Unreachable, match="is endpoint_url"):  # and the same from discovery
        Dataset.from_path("d", "s3://bucket/d/", storage_options=options)


async def test_an_endpoint_that_answered_before_gets_the_whole_retry_budget(
    s3_endpoint: S3Endpoint, shards: str
) -> None:
    proxy = FaultProxy(s3_endpoint.endpoint_url, Faults()).start()
    async with open_storage("s3://", s3_endpoint.storage_options(proxy.url), retry=FAST) as st:
        info = await st.stat(shards + "part-0.jsonl")
        proxy.stop()  # the endpoint goes away mid-run: a network blip gets every retry
        with pytest.raises(Unreachable) as err:
            await st.read(info.uri, 0, 10, version=info.version)
        assert st.stats.retries == FAST.max_attempts - 1
    assert f"gave up after {FAST.max_attempts} attempts" in "".join(err.value.__notes__)


def _pass(ds: Dataset, **kw: Any) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], shuffle="none", chunk_size=64)
    return Pipeline(ws, rank=0, world_size=1, lanes=1, range_cache_bytes=0, retry=FAST, **kw)


@pytest.mark.parametrize("same_bytes", [False, True])
def test_an_object_rewritten_after_discovery_is_refused_unless_its_bytes_are_the_same(
    s3_endpoint: S3Endpoint, s3_bucket: str, shards: str, same_bytes: bool
) -> None:
    # Scanned bytes kept for the first epoch would be the discovered version: none kept here.
    ds = Dataset.from_path(
        "d", shards, storage_options=s3_endpoint.storage_options(), keep_scan_bytes=0
    )
    # Rewritten between discovery and the run's reads. (Rewritten once the run had delivered
    # its first items, the shard had sometimes been read already: how far a run reads ahead
    # is not what this test is about.)
    body = jsonl(range(800, 1200)) if same_bytes else jsonl(range(5000, 5400))
    s3_endpoint.client().put_object(Bucket=s3_bucket, Key="d/part-2.jsonl", Body=body)
    it = iter(_pass(ds, fetch_budget_bytes=16 << 10, max_inflight_requests=2))
    if same_bytes:  # the same content is the same object (same ETag): the pass completes
        assert [s["id"] for s in it] == list(range(1200))
        return
    with pytest.raises(ObjectChanged, match=r"part-2\.jsonl"):
        for _ in it:
            pass


def test_throttling_that_never_ends_is_a_throttled_error(
    s3_endpoint: S3Endpoint, shards: str, proxy: FaultProxy
) -> None:
    ds = Dataset.from_path(
        "d", shards, storage_options=s3_endpoint.storage_options(proxy.url), keep_scan_bytes=0
    )  # (the pipeline's own reads are tested)
    proxy.faults = Faults(throttle_rate=1.0)  # from now on, every request is told to slow down
    with pytest.raises(Throttled, match=r"part-\d.jsonl \(status 503, SlowDown\)") as info:
        list(_pass(ds))
    # Throttling is waited out for throttle_timeout_s, past max_attempts, then reported.
    assert "gave up after" in "".join(info.value.__notes__)
    assert proxy.injected["throttle"] > FAST.max_attempts


@pytest.mark.parametrize(
    "proxy",
    [Faults(throttle_rate=0.15, reset_rate=0.05, truncate_rate=0.05, seed=5)],
    indirect=True,
)
def test_flaky_connections_change_nothing_in_a_two_lane_sync_run(
    s3_endpoint: S3Endpoint, shards: str, proxy: FaultProxy
) -> None:
    def run(options: dict[str, Any]) -> list[int]:
        ds = Dataset.from_path("d", shards, storage_options=options, keep_scan_bytes=0)
        ws = StaticMixtureWorkSource([ds], seed=4, shuffle="global", coalesce_gap_bytes=0)
        pipe = Pipeline(
            ws,
            rank=0,
            world_size=1,
            lanes=2,
            retry=RetryPolicy(max_attempts=12, base_delay_s=0.001, max_delay_s=0.01),
        )
        return [s["id"] for s in pipe]

    clean = run(s3_endpoint.storage_options())
    assert sorted(clean) == list(range(1200))
    assert run(s3_endpoint.storage_options(proxy.url)) == clean
    assert proxy.injected["throttle"] > 20 and proxy.injected["reset"] > 3

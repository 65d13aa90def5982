"""Round trips before the shards: what discovery of a prefix sends at once, and what it sends
alone, as seen by a proxy in front of the real S3 server that delays every request."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.formatdata import to_jsonable
from tests.integration.test_datasets import FIXTURES, _upload, read_all
from zephon.dataset import PERSISTENT_INDEX_NAME, Dataset, locate
from zephon.testing import FaultProxy, Faults, S3Endpoint

pytestmark = pytest.mark.integration

LATENCY_S = 0.3  # far above any scheduling delay between requests sent together


@pytest.fixture
def slow_proxy(s3_endpoint: S3Endpoint) -> Iterator[FaultProxy]:
    with FaultProxy(s3_endpoint.endpoint_url, Faults(latency_s=LATENCY_S)) as proxy:
        yield proxy


def _kind(path: str) -> str:
    name = path.split("?", 1)[0].rsplit("/", 1)[-1]
    if "list-type=2" in path:
        return "listing"
    return name if name in ("index.json", PERSISTENT_INDEX_NAME) else "shard"


def _before_shards(proxy: FaultProxy) -> list[tuple[str, int]]:
    """(kind, requests in the proxy when it arrived) of the requests before the first shard
    read."""
    out = []
    for _, path, in_flight in proxy.arrivals:
        if _kind(path) == "shard":
            break
        out.append((_kind(path), in_flight))
    return out


async def _mds_prefix(endpoint: S3Endpoint, bucket: str, tmp_path: Path) -> str:
    base = f"s3://{bucket}/mds/"
    shutil.copytree(FIXTURES / "mds", tmp_path / "mds")
    (tmp_path / "mds" / "reference.json").unlink()  # the fixture's answers, not data
    await _upload(base, endpoint.storage_options(), tmp_path / "mds")
    return base


async def test_alone_the_probe_listing_and_index_json_go_out_together(
    s3_endpoint: S3Endpoint, s3_bucket: str, slow_proxy: FaultProxy, tmp_path: Path
) -> None:
    base = await _mds_prefix(s3_endpoint, s3_bucket, tmp_path)
    options = s3_endpoint.storage_options(slow_proxy.url)
    cache = tmp_path / "cache"
    ds = await Dataset.afrom_path("mds", base, storage_options=options, index_cache=cache)
    first = _before_shards(slow_proxy)
    assert sorted(k for k, _ in first) == sorted([PERSISTENT_INDEX_NAME, "listing", "index.json"])
    assert max(n for _, n in first) == 3  # one round trip, not three
    assert ds.format == "mds" and ds.discovery_stats.listed > 0
    expected = await read_all(await Dataset.afrom_path("ref", str(tmp_path / "mds")))
    assert to_jsonable(await read_all(ds)) == to_jsonable(expected)

    # Known to have no index: the same three at once on the next discovery.
    slow_proxy.arrivals.clear()
    again = await Dataset.afrom_path("mds", base, storage_options=options, index_cache=cache)
    assert max(n for _, n in _before_shards(slow_proxy)) == 3
    assert again.shards == ds.shards

    # Known to have one: the probe alone, one request in all.
    await ds.awrite_index()
    await Dataset.afrom_path("mds", base, storage_options=options, index_cache=cache)
    slow_proxy.arrivals.clear()
    indexed = await Dataset.afrom_path("mds", base, storage_options=options, index_cache=cache)
    assert [_kind(p) for _, p, _ in slow_proxy.arrivals] == [PERSISTENT_INDEX_NAME]
    assert indexed.discovery_stats.requests == 1 and indexed.shards == ds.shards


async def test_a_rank_of_a_job_probes_alone_then_lists(
    s3_endpoint: S3Endpoint,
    s3_bucket: str,
    slow_proxy: FaultProxy,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank listing at once is the herd a persistent index avoids: ranks send the probe
    first, and nothing speculative."""
    base = await _mds_prefix(s3_endpoint, s3_bucket, tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "8")
    options = s3_endpoint.storage_options(slow_proxy.url)
    ds = await Dataset.afrom_path("mds", base, storage_options=options, index_cache=False)
    assert _before_shards(slow_proxy) == [
        (PERSISTENT_INDEX_NAME, 1),
        ("listing", 1),
        ("index.json", 1),
    ]
    assert ds.format == "mds"


async def test_a_speculative_index_json_that_differs_from_the_listing_is_read_again(
    s3_endpoint: S3Endpoint, s3_bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index.json read beside the listing is used only when it has the listed object's
    size; else it is read again, pinned to the listed version."""
    base = await _mds_prefix(s3_endpoint, s3_bucket, tmp_path)
    index = json.loads((tmp_path / "mds" / "index.json").read_bytes())
    index["shards"] = index["shards"][:1]  # an older index.json, racing the listing
    older = json.dumps(index).encode()

    async def stale(storage: object, uri: str) -> bytes:
        return older

    monkeypatch.setattr(locate, "_read_small", stale)
    ds = await Dataset.afrom_path(
        "mds", base, storage_options=s3_endpoint.storage_options(), index_cache=False
    )
    monkeypatch.undo()
    full = await Dataset.afrom_path("ref", str(tmp_path / "mds"), index_cache=False)
    assert len(ds.shards) == len(full.shards) > 1
    assert to_jsonable(await read_all(ds)) == to_jsonable(await read_all(full))

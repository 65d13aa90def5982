"""Datasets on the Hugging Face Hub (``hf://datasets/org/name[@revision]/path``) against a
local Hub-compatible server: JSONL, Parquet (the auto-converted ``refs/convert/parquet``
branch) and WebDataset files read by byte range; the revision pinned as a commit in
checkpoints; ``HF_TOKEN`` and ``HF_ENDPOINT`` honoured, the token never shown; a missing
repository, revision or file, a private repository without a token and a rate-limited Hub
each a typed error that names the path and says what to do."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import tarfile
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import AccessDenied, NotFound, StateMismatch, Throttled
from zephon.storage.hf import HFBackend
from zephon.testing import HubServer

pytestmark = pytest.mark.integration


def jsonl(first: int, n: int) -> bytes:
    return "".join(
        json.dumps({"i": i, "text": f"doc {i}"}) + "\n" for i in range(first, first + n)
    ).encode()


def parquet(n: int) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"i": list(range(n)), "text": ["t" * 30] * n}), out, row_group_size=500)
    return out.getvalue()


def tar(n: int) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as t:
        for i in range(n):
            for ext, data in (("txt", f"caption {i}".encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"{i:05d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[HubServer]:
    with HubServer(large=4096) as server:
        server.add(
            "org/docs",
            {
                "data/train-0.jsonl": jsonl(0, 100),
                "data/train-1.jsonl": jsonl(100, 100),
                "data/val-0.jsonl": jsonl(1000, 10),
                "images/shard-0.tar": tar(20),
                "README.md": b"# a dataset card",
            },
        )
        server.add(
            "org/docs", {"default/train/0000.parquet": parquet(5000)}, "refs/convert/parquet"
        )
        server.add("org/private", {"data/a.jsonl": jsonl(0, 5)}, private=True)
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        yield server


def ids(ds: Dataset, **kwargs: Any) -> list[int]:
    return sorted(int(x["i"]) for x in Pipeline(StaticMixtureWorkSource([ds], **kwargs)))


def test_jsonl_parquet_and_webdataset_files_by_byte_range(hub: HubServer) -> None:
    ds = Dataset.from_path("docs", "hf://datasets/org/docs/data/train-*.jsonl")
    assert ds.format == "jsonl" and ds.num_samples == 200
    assert ids(ds, shuffle="global") == list(range(200))
    converted = Dataset.from_path(
        "p", "hf://datasets/org/docs@refs%2Fconvert%2Fparquet/default/train/"
    )
    assert converted.format == "parquet" and ids(converted) == list(range(5000))
    ranged = [p for m, p, _ in hub.requests if p.startswith("/cdn/")]
    assert ranged, "the Parquet file is large: read from the CDN redirect, by range"
    images = Dataset.from_path("w", "hf://datasets/org/docs/images/", format="webdataset")
    rows = list(Pipeline(StaticMixtureWorkSource([images])))
    assert len(rows) == 20 and sorted(int(r["cls"]) for r in rows) == list(range(20))


def test_the_revision_is_pinned_as_a_commit_in_checkpoints(hub: HubServer) -> None:
    old = Dataset.from_path("docs", "hf://datasets/org/docs/data/train-0.jsonl")
    sha = hub.repos["org/docs"].refs["main"]
    assert f"@{sha}/" in old.shards[0].uri
    pipe = Pipeline(StaticMixtureWorkSource([old]))
    it = iter(pipe)
    next(it)
    state = json.loads(json.dumps(pipe.checkpoint()))
    it.close()  # type: ignore[attr-defined]
    assert sha in json.dumps(state)
    hub.add("org/docs", {"data/train-0.jsonl": jsonl(0, 100)[:-30] + b'{"i": 7}\n'})  # main moves
    moved = Dataset.from_path("docs", "hf://datasets/org/docs/data/train-0.jsonl")
    assert sha not in moved.shards[0].uri
    with pytest.raises(StateMismatch):
        Pipeline(StaticMixtureWorkSource([moved])).restore(state)
    pinned = Dataset.from_path("docs", f"hf://datasets/org/docs@{sha}/data/train-0.jsonl")
    again = Pipeline(StaticMixtureWorkSource([pinned]))
    again.restore(state)
    assert len(list(again)) == 99  # the rest of the pinned commit


def test_a_private_repository_needs_the_token_which_never_shows(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(AccessDenied, match="set HF_TOKEN") as err:
        Dataset.from_path("p", "hf://datasets/org/private/data/")
    assert "hf://datasets/org/private" in str(err.value)
    monkeypatch.setenv("HF_TOKEN", hub.token)
    caplog.set_level(logging.DEBUG)
    ds = Dataset.from_path("p", "hf://datasets/org/private/data/")
    pipe = Pipeline(StaticMixtureWorkSource([ds]))
    assert ids(ds) == list(range(5))
    shown = [
        repr(ds),
        repr(HFBackend()),
        json.dumps(pipe.checkpoint()),
        json.dumps(pipe.stats(), default=str),
        caplog.text,
    ]
    assert all(hub.token not in text for text in shown)
    with HubServer(token="hf_another_token_9876543210") as other:  # refused there
        other.add("org/private", {"a.jsonl": jsonl(0, 1)}, private=True)
        with pytest.raises(AccessDenied, match="may not read it") as err:
            Dataset.from_path(
                "p", "hf://datasets/org/private/", storage_options={"endpoint": other.url}
            )
        assert hub.token not in str(err.value)


def test_large_files_redirect_without_the_token(
    hub: HubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", hub.token)
    ds = Dataset.from_path("p", "hf://datasets/org/docs@refs%2Fconvert%2Fparquet/default/train/")
    assert len(ids(ds)) == 5000
    resolve = [auth for _, p, auth in hub.requests if "/resolve/" in p]
    cdn = [auth for _, p, auth in hub.requests if p.startswith("/cdn/")]
    assert resolve and all(resolve) and cdn and not any(cdn)


@pytest.mark.parametrize(
    ("path", "what"),
    [
        ("hf://datasets/org/nope/data/", "dataset 'org/nope'"),
        ("hf://datasets/org/docs@v9/data/", "revision 'v9'"),
        ("hf://datasets/org/docs/data/missing.jsonl", "file 'data/missing.jsonl'"),
    ],
)
def test_a_missing_repository_revision_or_file_names_the_path(
    hub: HubServer, path: str, what: str
) -> None:
    with pytest.raises(NotFound) as err:
        Dataset.from_path("x", path)
    text = str(err.value)
    assert what in text and "check the repository name, the revision and the path" in text
    assert "hf://datasets/org/" in text


def test_a_rate_limited_hub_is_retried_then_a_typed_error(hub: HubServer) -> None:
    hub.throttle = 2  # two 429s: retried, then it reads
    assert Dataset.from_path("docs", "hf://datasets/org/docs/data/val-0.jsonl").num_samples == 10

    async def one_attempt() -> None:
        backend = HFBackend()
        try:
            hub.throttle = 1
            await backend.get_range("hf://datasets/org/docs/data/val-0.jsonl", 0, 10, None)
        finally:
            await backend.aclose()

    with pytest.raises(Throttled, match="rate-limited by the Hub: wait, or set HF_TOKEN"):
        asyncio.run(one_attempt())

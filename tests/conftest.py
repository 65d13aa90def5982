"""Fixtures that start real storage servers once per test session.

S3: moto in server mode on a free port, or the external endpoint (e.g. MinIO) named by
``ZEPHON_TEST_S3_ENDPOINT`` with ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``.
GCS: fake-gcs-server. Azure: Azurite (npm). HTTP: aiohttp's static file server over a
temporary directory.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon.testing import Azurite, GCSEmulator, MotoServer, S3Endpoint, StaticHTTPServer


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[S3Endpoint]:
    external = S3Endpoint.from_env()
    if external is not None:
        yield external
        return
    server = MotoServer()
    yield server.start()
    server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint: S3Endpoint) -> str:
    bucket = _unique("zephon-test")
    s3_endpoint.create_bucket(bucket)
    return bucket


@pytest.fixture(scope="session")
def gcs_emulator() -> Iterator[GCSEmulator]:
    emulator = GCSEmulator()
    emulator.start()
    yield emulator
    emulator.stop()


@pytest.fixture
def gcs_bucket(gcs_emulator: GCSEmulator) -> str:
    bucket = _unique("zephon-test")
    gcs_emulator.create_bucket(bucket)
    return bucket


@pytest.fixture(scope="session")
def azurite() -> Iterator[Azurite]:
    server = Azurite()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def azure_container(azurite: Azurite) -> str:
    container = _unique("zephon-test")
    azurite.create_container(container)
    return container


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    root = tmp_path_factory.mktemp("http-root")
    server = StaticHTTPServer(root)
    url = server.start()
    yield url, root
    server.stop()


@pytest.fixture(autouse=True)
def _isolated_index_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test gets its own local index cache, so no test sees another's indexes."""
    monkeypatch.setenv("ZEPHON_CACHE_DIR", str(tmp_path / "zephon-cache"))

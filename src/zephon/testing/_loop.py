"""An asyncio event loop on a daemon thread, to host aiohttp servers beside synchronous code."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class AppServer:
    """Serve an aiohttp application on 127.0.0.1, port 0, from its own loop thread."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self._loop = LoopThread()
        self._runner: web.AppRunner | None = None
        self.port = 0

    def start(self) -> str:
        async def _start() -> int:
            self._runner = web.AppRunner(self._app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            sockets = getattr(site._server, "sockets", None)
            assert sockets, "aiohttp site has no listening socket"
            return int(sockets[0].getsockname()[1])

        self.port = self._loop.run(_start())
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._runner is not None:
            self._loop.run(self._runner.cleanup())
            self._runner = None
        self._loop.stop()

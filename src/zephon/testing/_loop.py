"""An asyncio event loop on a daemon thread, to host aiohttp servers beside synchronous code.

The loop is uvloop's (as the pipeline's): stopping asyncio's own loop while a client was
connecting left the accepted socket open (found unclosed by the garbage collector later, in
another test)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from aiohttp import web

from zephon.pipeline.bridge import new_loop

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = new_loop()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        """Run until ``stop()``; then cancel and await the tasks left (requests in flight)
        and close the loop."""
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()
        while left := asyncio.all_tasks(self.loop):  # each round may start more
            for task in left:
                task.cancel()
            self.loop.run_until_complete(asyncio.gather(*left, return_exceptions=True))
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def stop(self) -> None:
        """Stop the loop and wait for its thread (again: nothing)."""
        if not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()


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

"""A pool of Ray actors with the worker pool's interface: ``await run(stage, fn, *args)``.

Each call ships one block (``fn`` and its arguments; Ray puts large ones in its object store)
to the actor with the fewest calls in flight and awaits the result's ``ObjectRef``, so the
event loop never blocks on Ray. An actor that dies (killed, out of memory, its node lost) is
replaced and the call runs again on the new one, up to ``max_retries`` times, then
:class:`~zephon.errors.WorkerCrashed` names the stage. An exception raised by ``fn`` comes
back with its type, its notes and the actor's traceback text as a note. ``close()`` kills
every actor. Ray is imported only when a pool starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from zephon.errors import ConfigError, WorkerCrashed, redact_uri
from zephon.executors import Ray
from zephon.storage import logsecrets

__all__ = ["RayPool"]

T = TypeVar("T")


class _Actor:
    """The actor's class: runs a block's function, returns its result or its exception."""

    def call(self, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any, str]:
        try:
            return True, fn(*args), ""
        except Exception as exc:  # shipped back whole: the consumer sees the original type
            return False, exc, "".join(traceback.format_exception(exc))

    def pid(self) -> int:
        return os.getpid()


_CONNECTOR: ThreadPoolExecutor | None = None


def _connector() -> ThreadPoolExecutor:
    """The thread that connects to Ray, the same for the life of the process. A cluster Ray
    starts here dies with the thread that started it (its processes are killed when their
    parent thread ends), so it must not be a thread of one run: a second pipeline in the
    same process once found the cluster gone ("Failed to connect to GCS within 60 seconds",
    and the process ended)."""
    global _CONNECTOR
    if _CONNECTOR is None:
        _CONNECTOR = ThreadPoolExecutor(1, "zephon-ray")
    return _CONNECTOR


def _connect(ray: Any, address: str | None) -> None:
    """Connect to the cluster at ``address``, or start one on this machine. Started here, it
    runs on loopback: Ray otherwise binds it to the address the machine routes out of, which
    in containers and sandboxes the machine itself may not reach ("Failed to connect to GCS"
    at its own address after a minute), and a cluster of one machine needs no other."""
    options = {"ignore_reinit_error": True, "log_to_driver": False, "include_dashboard": False}
    if address is not None:
        ray.init(address=address, **options)
        return
    from ray._private import ray_constants

    routed = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False  # what Ray does on macOS: the node on loopback
    try:
        # "local": a new cluster, never one a crashed earlier session left as the default
        ray.init(address="local", _node_ip_address="127.0.0.1", **options)
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = routed


def _connect_error(exc: Exception, address: str | None) -> ConfigError:
    """What to do when Ray cannot be reached or started."""
    where = f"the Ray cluster at {redact_uri(address)}" if address else "a local Ray cluster"
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = f"{type(exc).__name__}: {logsecrets.scrub(first)[:300]}"
    if "InvalidAuthToken" in str(exc) or type(exc).__name__ == "AuthenticationError":
        advice = (
            "the cluster uses token authentication and this process has another token "
            "(RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH or ~/.ray/auth_token) or none; give it "
            "the cluster's token, or set RAY_AUTH_MODE to match the cluster"
        )
    else:
        advice = (
            "check the address (executor=Ray(address=...) or RAY_ADDRESS) and that its "
            "GCS port is reachable from here"
        )
    return ConfigError(f"cannot connect to {where} ({text}): {advice}")


class RayPool:
    """Actors started on first use (connecting to the cluster off the event loop)."""

    def __init__(self, config: Ray) -> None:
        self.config = config
        self._actors: list[Any] = []
        self._load: list[int] = []
        self._starting: asyncio.Task[None] | None = None
        self._ray: Any = None
        self._remote: Any = None
        self.retries = 0

    async def _start(self) -> None:
        try:
            import ray
        except ImportError:
            raise ConfigError(
                "executor=Ray(...) needs the ray package: pip install 'zephon[ray]'"
            ) from None
        config = self.config
        if not ray.is_initialized():
            address = config.address or os.environ.get("RAY_ADDRESS")
            try:
                await asyncio.wrap_future(_connector().submit(_connect, ray, address))
            except Exception as exc:
                raise _connect_error(exc, address) from None
        self._ray = ray
        options: dict[str, Any] = {"num_cpus": config.num_cpus_per_actor, "max_restarts": 0}
        if config.runtime_env is not None:
            options["runtime_env"] = config.runtime_env
        self._remote = ray.remote(_Actor).options(**options)
        self._actors = [self._remote.remote() for _ in range(config.num_actors)]
        self._load = [0] * config.num_actors

    @property
    def processes(self) -> int:
        """How many actors share the work."""
        return int(self.config.num_actors)

    def prestart(self) -> None:
        """Connect and start the actors in the background (a run calls this at its start, so
        actor start-up overlaps planning and the first fetches)."""
        if self._starting is None:
            self._starting = asyncio.ensure_future(self._start())

    async def _ready(self) -> None:
        self.prestart()
        assert self._starting is not None
        await asyncio.shield(self._starting)

    async def run(self, stage: str, fn: Callable[..., T], *args: Any, gil_free: bool = False) -> T:
        """``fn(*args)`` on an actor (see the module doc for failures). ``gil_free`` is the
        local pool's (its head start); actors always run the call."""
        await self._ready()
        ray = self._ray
        for attempt in range(self.config.max_retries + 1):
            i = min(range(len(self._actors)), key=self._load.__getitem__)
            actor = self._actors[i]
            self._load[i] += 1
            try:
                ok, value, trace = await actor.call.remote(fn, *args)
            except ray.exceptions.RayActorError:
                if self._actors[i] is actor:  # the first call to notice: replace the actor
                    self._actors[i] = self._remote.remote()
                    self.retries += 1
                if attempt == self.config.max_retries:
                    raise WorkerCrashed(
                        f"a Ray actor died while running stage {stage!r}, "
                        f"{attempt + 1} times for the same block (killed, out of memory, "
                        "a crash in native code, or its node lost)"
                    ) from None
                continue
            finally:
                self._load[i] -= 1
            if not ok:
                value.add_note(f"zephon: raised in a Ray actor; its traceback:\n{trace}")
                raise value
            return value  # type: ignore[no-any-return]
        raise AssertionError("unreachable")

    async def pids(self) -> list[int]:
        """The actors' process ids."""
        await self._ready()
        return list(await asyncio.gather(*(a.pid.remote() for a in self._actors)))

    def close(self) -> None:
        """Kill every actor (the cluster, and the connection to it, stay)."""
        ray, self._ray = self._ray, None
        if ray is None:
            return
        for actor in self._actors:
            with contextlib.suppress(Exception):  # already gone, or the cluster is down
                ray.kill(actor, no_restart=True)
        self._actors, self._load = [], []

"""A local Ray cluster for tests and benchmarks: ``ray start --head --block`` on loopback in a
child process (the caller connects to it by address, as a driver to any cluster); stopping
the child stops the cluster it started, and nothing else.

It is kept apart from the user's own Ray state: token authentication is off for the head and,
while it runs, for this process (``RAY_AUTH_MODE=disabled``), so an ``~/.ray/auth_token``
left by an earlier Ray session (which a head reads, then refusing every driver without that
token) changes nothing."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

__all__ = ["RayCluster"]

_AUTH_MODE = "RAY_AUTH_MODE"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RayCluster:
    """``with RayCluster(cpus=2) as address:`` a head node on this machine."""

    def __init__(self, cpus: int = 2) -> None:
        self.cpus = cpus
        self._child: subprocess.Popen[str] | None = None
        self._auth_mode: str | None = None
        self.address = ""

    def start(self) -> str:
        self._auth_mode = os.environ.get(_AUTH_MODE)
        os.environ[_AUTH_MODE] = "disabled"  # this process, the driver (module doc)
        env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
        env.pop("RAY_ADDRESS", None)
        port = _free_port()
        ray = Path(sys.executable).with_name("ray")
        self._child = subprocess.Popen(
            [
                str(ray),
                "start",
                "--head",
                "--block",
                f"--port={port}",
                "--node-ip-address=127.0.0.1",
                f"--num-cpus={self.cpus}",
                "--include-dashboard=false",
                "--disable-usage-stats",
                f"--object-store-memory={256 << 20}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            start_new_session=True,
        )
        assert self._child.stdout is not None
        for line in self._child.stdout:  # the head prints this once it serves
            if "Ray runtime started" in line:
                self.address = f"127.0.0.1:{port}"
                return self.address
        self.stop()
        raise RuntimeError("the Ray head did not start")

    def stop(self) -> None:
        child, self._child = self._child, None
        if child is None:
            return
        if self._auth_mode is None:
            os.environ.pop(_AUTH_MODE, None)
        else:
            os.environ[_AUTH_MODE] = self._auth_mode
        child.send_signal(signal.SIGTERM)  # --block: stops what it started, then exits
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        if child.stdout is not None:
            child.stdout.close()

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

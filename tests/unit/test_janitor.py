"""Segments of process trees that are gone are removed by the next run (a tracker killed
with its tree: a cgroup taken down whole)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zephon.engine import janitor

LINUX_SHM = Path("/proc/self/stat").exists() and Path("/dev/shm").is_dir()
pytestmark = pytest.mark.skipif(not LINUX_SHM, reason="Linux /dev/shm")


def _last_child() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def _make(name: str, written: float | None = None) -> Path:
    path = Path(janitor.SHM_DIR, name)
    path.write_bytes(b"\0" * 64)
    if written is not None:
        os.utime(path, (written, written))
    return path


def test_segments_whose_owner_is_gone_or_reborn_are_stale_and_others_not() -> None:
    dead = _last_child()
    me = os.getpid()
    gone = _make(f"{janitor.owner_prefix(dead)}p0_{dead:x}_0")
    reborn = _make(f"{janitor.owner_prefix(me)}p77_{me:x}_0", written=time.time() - 3600 * 24 * 400)
    mine = _make(f"{janitor.owner_prefix(me)}p78_{me:x}_0")
    foreign = _make("zphtest_not_ours")
    try:
        found = set(janitor.stale())
        assert gone.name in found
        assert reborn.name in found  # this pid's earlier holder wrote it, long before we started
        assert mine.name not in found and foreign.name not in found
        # A fresh process removes them when it first starts workers.
        code = "from zephon.engine import janitor; janitor.ensure()"
        subprocess.run([sys.executable, "-c", code], check=True)
        assert not gone.exists() and not reborn.exists()
        assert mine.exists() and foreign.exists()
    finally:
        for path in (gone, reborn, mine, foreign):
            path.unlink(missing_ok=True)


def test_owner_names_do_not_run_into_longer_pids() -> None:
    assert janitor.owned_by("zph1ap0_1a_0", 0x1A)
    assert not janitor.owned_by("zph1abp0_1ab_0", 0x1A)
    assert not janitor.owned_by("zphtest_", 0x1A)

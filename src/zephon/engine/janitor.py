"""Shared memory never outlives the process tree that made it.

Segments and semaphores that worker processes share are registered with multiprocessing's
resource tracker, which removes whatever is left once every process holding its pipe has
ended. Started the usual way, the tracker is in the process group it watches, so a kill of
the whole group (``kill -9 -PGID``, what a scheduler does after its grace period) killed it
too and left every segment in flight behind (1-2 GB in ``/dev/shm`` for an image run). Here,
the first time a process starts workers, the tracker starts in a session of its own: a
signal to the group does not reach it, and it cleans up after the group as it does after
one process.

A tracker killed too (a whole cgroup taken down, a machine restart that keeps
``/dev/shm``) leaves the next run to clean up: Zephon names every segment
``zph<owner pid in hex><tag>...`` (the owner is the process whose pool or process engine
the segment serves; the tag is a letter past ``f``), and the first start of workers in a
process removes the segments whose owner is gone, or whose owner's pid now belongs to a
process started after the segment was last written (pids are reused, quickly in a
container).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal

__all__ = ["ROOT", "ensure", "owned_by", "owner_prefix", "stale"]

ROOT = "zph"
SHM_DIR = "/dev/shm"
_NAME = re.compile(r"zph([0-9a-f]+)[g-z]")
_started_for: int | None = None  # the process that ran ensure() (a forked child runs it again)


def owner_prefix(pid: int | None = None) -> str:
    """``zph<pid>``: the start of every segment name owned by process ``pid`` (this one)."""
    return f"{ROOT}{(os.getpid() if pid is None else pid):x}"


def ensure() -> None:
    """Once per process (a forked child again): start the resource tracker apart from this
    process group unless one runs already, and remove the segments of gone process trees."""
    global _started_for
    pid = os.getpid()
    if _started_for == pid:
        return
    _started_for = pid
    if os.name == "posix":
        _start_tracker_apart()
    for name in stale():
        _unlink(name)


def _start_tracker_apart() -> None:
    """multiprocessing's resource tracker, started as it would start itself but in a session
    of its own (a tracker already running, or one of a Python whose tracker this does not
    know, is left as it is)."""
    from multiprocessing import resource_tracker, spawn, util

    tracker = getattr(resource_tracker, "_resource_tracker", None)
    lock = getattr(tracker, "_lock", None)
    if tracker is None or lock is None or not hasattr(tracker, "_pid"):
        return
    with lock:
        if getattr(tracker, "_fd", 0) is not None:
            return
        r, w = os.pipe()
        try:
            os.set_inheritable(r, True)
            exe = spawn.get_executable()
            code = f"from multiprocessing.resource_tracker import main; main({r})"
            flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]
            args = [exe, *flags, "-c", code]
            # Blocked until the tracker ignores them, as the standard start does.
            blocked = (signal.SIGINT, signal.SIGTERM)
            pid = os.posix_spawn(exe, args, os.environ, setsid=True, setsigmask=blocked)
        except BaseException:
            os.close(w)
            raise
        else:
            tracker._fd, tracker._pid = w, pid
        finally:
            os.close(r)


def _names() -> list[str]:
    try:
        return [n for n in os.listdir(SHM_DIR) if n.startswith(ROOT)]
    except OSError:
        return []


def owned_by(name: str, pid: int) -> bool:
    """Whether segment ``name`` is owned by process ``pid``."""
    match = _NAME.match(name)
    return match is not None and int(match.group(1), 16) == pid


def _unlink(name: str) -> None:
    with contextlib.suppress(OSError):  # removed meanwhile by its owner
        os.unlink(os.path.join(SHM_DIR, name))


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as f:
            for line in f:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return None


def _started_at(pid: int, boot: float | None) -> float | None:
    """When process ``pid`` started (seconds since the epoch), ``None`` if it is gone;
    ``0.0`` if it runs but its start cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:
        return 0.0
    if fields[0] in ("Z", "X"):
        return None
    if boot is None:
        return 0.0
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def stale() -> list[str]:
    """Segments left by process trees that are gone: the owner is not running, or its pid
    now belongs to a process that started after the segment was last written."""
    if not os.path.isdir("/proc"):
        return []
    boot, found, starts = _boot_time(), [], {}
    for name in _names():
        match = _NAME.match(name)
        if match is None:
            continue
        owner = int(match.group(1), 16)
        if owner not in starts:
            starts[owner] = _started_at(owner, boot)
        started = starts[owner]
        if started is None:
            found.append(name)
            continue
        try:
            written = os.stat(os.path.join(SHM_DIR, name)).st_mtime
        except OSError:
            continue
        if started > written + 2.0:  # the clock ticks of /proc and btime's whole seconds
            found.append(name)
    return found

"""Lifecycle at the edges: a pipeline never keeps the interpreter alive.

Each case is a real script in a child process that leaves a live iterator behind in a
different way; it must exit within the timeout, with the status and traceback a script
without Zephon would have, and never abort."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests import pipeline_fns as fns

ROOT = Path(__file__).resolve().parents[2]

PRELUDE = """
import asyncio
import sys
import threading
from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

def build(processes=0, lanes=1, engine="thread"):
    ds = Dataset.from_path("a", sys.argv[1])
    ws = StaticMixtureWorkSource([ds], seed=1, stop_after_passes=None)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=lanes, engine=engine)
    return pipe.map(fns.double, processes=processes) if processes else pipe
"""

ENDINGS = {
    # the usual training loop shape: a live iterator when the script ends
    "live iterator at the end": ("it = iter(build(P, L)); next(it)", 0, None),
    "uncaught exception": ("it = iter(build(P, L)); next(it)\nraise ValueError('user bug')", 1,
                           "ValueError: user bug"),
    "KeyboardInterrupt": ("it = iter(build(P, L)); next(it)\nraise KeyboardInterrupt", None,
                          "KeyboardInterrupt"),
    "sys.exit inside the loop": ("for x in build(P, L):\n    sys.exit(3)", 3, None),
    "exception inside the loop": ("for x in build(P, L):\n    raise RuntimeError('in loop')", 1,
                                  "RuntimeError: in loop"),
    "two live iterators": ("a = iter(build(P, L)); next(a)\nb = iter(build(P, L)); next(b)", 0,
                           None),
    # async: a break, and a wait cancelled while the first item is on its way
    "async break": ("async def main():\n    async for x in build(P, L):\n        break\n"
                    "asyncio.run(main())", 0, None),
    "async timeout": ("async def main():\n    it = build(P, L).__aiter__()\n"
                      "    async with asyncio.timeout(0):\n        await anext(it)\n"
                      "asyncio.run(main())", 1, "TimeoutError"),
    # a consumer on a daemon thread when the script ends, and one stopped by close()
    "consumer thread at exit": ("started = threading.Event()\ndef consume():\n"
                                "    for x in build(P, L):\n        started.set()\n"
                                "threading.Thread(target=consume, daemon=True).start()\n"
                                "started.wait()", 0, None),
    "close() from another thread": ("pipe, started, errors = build(P, L), threading.Event(), []\n"
                                    "def consume():\n    try:\n        for x in pipe:\n"
                                    "            started.set()\n    except BaseException as e:\n"
                                    "        errors.append(e)\n"
                                    "t = threading.Thread(target=consume)\nt.start()\n"
                                    "started.wait()\npipe.close()\nt.join()\n"
                                    "assert not errors, errors", 0, None),
}  # fmt: skip


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("lifecycle")
    for s in range(2):
        rows = (json.dumps({"id": s * 1000 + i, "text": "x" * 50}) for i in range(1000))
        (root / f"p{s}.jsonl").write_text("\n".join(rows) + "\n")
    return root


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "processes,lanes,engine",
    [(0, 1, "thread"), (0, 2, "thread"), (2, 2, "thread"), (0, 2, "process"), (2, 2, "process")],
)
@pytest.mark.parametrize("ending", list(ENDINGS))
def test_a_script_with_a_live_pipeline_exits_promptly(
    data: Path, ending: str, processes: int, lanes: int, engine: str
) -> None:
    body, code, message = ENDINGS[ending]
    body = body.replace("P, L", f"{processes}, {lanes}, {engine!r}")
    script = PRELUDE + "\nif __name__ == '__main__':\n" + textwrap.indent(body, "    ") + "\n"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(data)],
        capture_output=True,
        text=True,
        timeout=15,
        env=env,
        cwd=ROOT,
    )
    assert "terminate called" not in out.stderr
    assert "Traceback" not in out.stderr or message is not None, out.stderr
    if code is not None:
        assert out.returncode == code, out.stderr
    else:
        assert out.returncode != 0
    if message is not None:  # the script's own error, last: nothing raised while leaving
        assert out.stderr.strip().splitlines()[-1].startswith(message), out.stderr
    for noise in (
        "Unclosed",
        "Task was destroyed",
        "never retrieved",
        "Exception in thread",
        "Exception ignored",
    ):
        assert noise not in out.stderr, out.stderr


@pytest.mark.timeout(60)
@pytest.mark.parametrize("processes", [0, 2])
@pytest.mark.parametrize(
    "fn,kind", [("interrupt_on_13", KeyboardInterrupt), ("exit_on_13", SystemExit)]
)
def test_a_base_exception_in_a_user_function_reaches_the_consumer(
    fn: str, kind: type[BaseException], processes: int
) -> None:
    import asyncio

    from tests import pipeline_fns as fns
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    ds = Dataset.from_records("b", [{"id": i} for i in range(200)], samples_per_shard=50)

    def build() -> Pipeline:
        ws = StaticMixtureWorkSource([ds], shuffle="none")
        return Pipeline(ws, rank=0, world_size=1, lanes=2).map(getattr(fns, fn), processes)

    with pytest.raises(kind):  # sync: the loop thread must not die with it
        list(build())

    async def consume() -> None:
        async for _ in build():
            pass

    with pytest.raises(kind):
        asyncio.run(consume())


@pytest.mark.timeout(60)
@pytest.mark.parametrize("processes", [0, 2])
def test_os_exit_in_a_user_function(data: Path, processes: int) -> None:
    """In the consumer's process it ends the process there and then, with its status; in a
    worker it is a crash, reported as WorkerCrashed naming the stage."""
    script = PRELUDE + (
        "\nif __name__ == '__main__':\n"
        "    ds = Dataset.from_path('a', sys.argv[1])\n"
        "    ws = StaticMixtureWorkSource([ds], seed=1, shuffle='none')\n"
        "    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2)\n"
        f"    for x in pipe.map(fns.die_on_7, processes={processes}):\n"
        "        pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script, str(data)],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
        cwd=ROOT,
    )
    assert "terminate called" not in out.stderr
    if processes == 0:
        assert out.returncode == 3, out.stderr
    else:
        assert out.returncode == 1
        assert "WorkerCrashed" in out.stderr and "map#0" in out.stderr, out.stderr[-2000:]
    assert "Unclosed" not in out.stderr, out.stderr


PIPELINES = {  # what the script runs: a step in a worker pool, or the whole pipeline in a child
    "pool": "Pipeline(ws, rank=0, world_size=1).map(fns.die_on_7, processes=2)",
    "engine": "Pipeline(ws, rank=0, world_size=1, engine='process')",
}


@pytest.mark.timeout(90)
@pytest.mark.parametrize(("runs", "guarded"), [("pool", False), ("pool", True), ("engine", False)])
def test_a_script_without_a_main_guard_is_told_what_to_do(
    data: Path, tmp_path: Path, runs: str, guarded: bool
) -> None:
    """A script whose top level runs a pipeline with worker processes (or in a child
    process) would run again in each new process, which would die starting up: refused
    before any starts (so none prints a traceback of its own), saying to add the guard. (The
    child-process engine once blocked for good there: the pipeline, larger than a pipe's
    buffer, went to a child that had died running the script again.) A guarded script whose
    worker dies mid-task (os._exit) gets no such advice."""
    body = (
        "ds = Dataset.from_path('a', sys.argv[1])\n"
        "ws = StaticMixtureWorkSource([ds], seed=1, shuffle='none')\n"
        f"for x in {PIPELINES[runs]}:\n"
        "    pass\n"
    )
    if guarded:
        body = "if __name__ == '__main__':\n" + textwrap.indent(body, "    ")
    script = tmp_path / "train.py"
    script.write_text(PRELUDE + body)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, str(script), str(data)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 1
    if guarded:
        assert "WorkerCrashed" in out.stderr, out.stderr[-2000:]
        assert "__main__" not in out.stderr.rsplit("WorkerCrashed", 1)[1]
        return
    assert "ConfigError: worker processes cannot start from the top level of train.py" in (
        out.stderr
    ), out.stderr[-2000:]
    assert 'under `if __name__ == "__main__":`' in out.stderr
    assert out.stderr.count("Traceback (most recent call last)") == 1  # ours alone


THREAD_SCRIPT = """
import asyncio, sys, threading
from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

ds = Dataset.from_path("a", sys.argv[1])
ws = StaticMixtureWorkSource([ds], seed=1, stop_after_passes=3)
pipe = Pipeline(ws, rank=0, world_size=1, lanes=2).map(fns.double, processes=int(sys.argv[2]))
started = threading.Event()

async def consume_async():
    n = 0
    async for x in pipe:
        n += 1
        started.set()
    print("consumed", n)

def consume():
    if sys.argv[3] == "async for":
        return asyncio.run(consume_async())
    n = 0
    for x in pipe:
        n += 1
        started.set()
    print("consumed", n)

if __name__ == "__main__":
    threading.Thread(target=consume).start()
    started.wait()  # the main thread ends here, the training thread goes on
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["for", "async for"])
@pytest.mark.parametrize("processes", [0, 2])
def test_a_training_thread_goes_on_after_the_main_thread_ends(
    data: Path, processes: int, how: str
) -> None:
    """The interpreter shuts process pools and thread pools down when the main thread is done,
    before it waits for the other threads: a pipeline iterated on a (non-daemon) thread of its
    own died then with ``cannot schedule new futures after shutdown``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", THREAD_SCRIPT, str(data), str(processes), how],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=ROOT,
    )
    assert (out.returncode, out.stdout) == (0, "consumed 6000\n"), out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr


KILL_SCRIPT = """
import json, os, sys
from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

ds = Dataset.from_path("a", sys.argv[1])
pipe = (Pipeline(StaticMixtureWorkSource([ds], seed=9), rank=0, world_size=1, lanes=2)
        .map(fns.double, processes=int(sys.argv[4])).shuffle(64).batch(8))
state_file = sys.argv[2]
mode = sys.argv[3]
ids = []
if mode == "resume":
    saved = json.load(open(state_file))
    pipe.restore(saved["state"])
for step, batch in enumerate(pipe):
    ids.extend(int(x) for x in batch["id"])
    if mode == "run" and step % 5 == 4:  # a checkpoint every 5 steps, written atomically
        with open(state_file + ".tmp", "w") as f:
            json.dump({"state": pipe.checkpoint(), "ids": ids}, f)
        os.replace(state_file + ".tmp", state_file)
        print("saved", step, flush=True)
print(json.dumps(ids), flush=True)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("processes", [0, 2])
def test_sigkill_mid_run_then_restore_equals_the_uninterrupted_run(
    data: Path, tmp_path: Path, processes: int
) -> None:
    import signal

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    state = str(tmp_path / "state.json")

    def run(mode: str) -> list[int]:
        out = subprocess.run(
            [sys.executable, "-c", KILL_SCRIPT, str(data), state, mode, str(processes)],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            cwd=ROOT,
            check=True,
        )
        return list(json.loads(out.stdout.strip().splitlines()[-1]))

    full = run("full")
    with subprocess.Popen(
        [sys.executable, "-c", KILL_SCRIPT, str(data), state, "run", str(processes)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:  # wait for the third checkpoint, then kill without warning
            if line.startswith("saved 14"):
                child.send_signal(signal.SIGKILL)
                break
        child.wait(timeout=30)
    saved = json.loads(Path(state).read_text())
    assert saved["ids"] == full[: len(saved["ids"])]
    assert saved["ids"] + run("resume") == full


@pytest.mark.timeout(90)
@pytest.mark.parametrize("processes", [0, 2])
def test_sigint_stops_a_script_with_its_keyboard_interrupt(data: Path, processes: int) -> None:
    import signal

    # A script run from a terminal has Python's Ctrl-C handler. One started by a runner that
    # ignores SIGINT (a shell's background job) inherits the ignoring, and Python then keeps
    # it: the script, not the library, would never see the Ctrl-C.
    script = PRELUDE + (
        "\nif __name__ == '__main__':\n"
        "    import signal\n"
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"    for i, x in enumerate(build({processes}, 2)):\n"
        "        if i == 10:\n"
        "            print('ready', flush=True)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-X", "faulthandler", "-c", script, str(data)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    # Ctrl-C in a terminal signals the whole process group: the script and its workers.
    with subprocess.Popen(
        cmd, text=True, env=env, cwd=ROOT, start_new_session=True, **pipes
    ) as child:  # type: ignore[call-overload]
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        os.killpg(child.pid, signal.SIGINT)
        try:
            _, err = child.communicate(timeout=30)  # EOF once the workers are gone too
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGABRT)  # faulthandler: every thread's stack
            _, err = child.communicate(timeout=15)
            pytest.fail(f"no exit within 30 s of SIGINT; stacks:\n{err[-6000:]}")
    assert child.returncode != 0 and "KeyboardInterrupt" in err
    assert "terminate called" not in err
    # no worker, forkserver or resource tracker left behind (they notice the end of their
    # parent on their own, so give them a moment: waited on with pidfds, not sleeps)
    assert _gone_within(child.pid, 10.0) == []


@pytest.mark.timeout(90)
@pytest.mark.parametrize("engine", ["thread", "process"])
def test_a_script_killed_outright_leaves_no_process_behind(data: Path, engine: str) -> None:
    """SIGKILL (the out-of-memory killer) leaves the script no time to stop anything: its
    worker processes, their fork server and (``engine="process"``) its pipeline's process
    notice on their own and end."""
    import signal

    script = PRELUDE + (
        "\nif __name__ == '__main__':\n"
        f"    for i, x in enumerate(build(2, 2, {engine!r})):\n"
        "        if i == 10:\n"
        "            print('ready', flush=True)\n"
    )
    with _ready_script(script, data, stderr=False) as child:
        child.send_signal(signal.SIGKILL)  # the script alone, as the kernel would
        child.wait(timeout=30)
        left = _gone_within(child.pid, 15.0)
        for pid in left:  # not left to outlive the test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert left == []


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
@pytest.mark.parametrize("engine", ["thread", "process"])
def test_a_process_group_killed_outright_leaves_no_shared_memory(data: Path, engine: str) -> None:
    """``kill -9 -PGID`` (a scheduler after its grace period) kills the script, its workers,
    its pipeline's process at once: nobody of the group is left to remove the segments and
    semaphores in flight, so the resource tracker does it from outside the group."""
    import signal

    script = PRELUDE.replace("fns.double", "fns.picture") + (
        "\nif __name__ == '__main__':\n"
        f"    for i, x in enumerate(build(2, 2, {engine!r})):\n"
        "        if i == 40:\n"
        "            print('ready', flush=True)\n"
    )
    before = set(os.listdir("/dev/shm"))
    with _ready_script(script, data, stderr=False) as child:
        trackers = _trackers_of(_live_in_group(child.pid))
        made = set(os.listdir("/dev/shm")) - before
        os.killpg(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    assert _gone_within(child.pid, 15.0) == []
    assert any(n.startswith("zph") for n in made), "no shared memory: the test shows nothing"
    assert trackers, "no resource tracker outside the process group"
    for tracker in trackers:
        _gone_within_pid(tracker, 30.0)
    assert set(os.listdir("/dev/shm")) - before == set()  # segments and semaphores


@pytest.mark.parametrize("when", ["while the child starts", "after the first item"])
def test_ctrl_c_with_the_process_engine_prints_one_traceback(data: Path, when: str) -> None:
    """Ctrl-C signals the whole process group: the pipeline's process ignores it (the
    parent stops it), so only the script's own KeyboardInterrupt is printed (the child once
    printed an EOFError or UnpicklingError of its own, and "Unclosed client session")."""
    import signal

    step = "fns.SlowToStart()" if when == "while the child starts" else "fns.double"
    script = PRELUDE + (  # Python's Ctrl-C handler, as from a terminal (see the test above)
        "\nif __name__ == '__main__':\n"
        "    import signal\n"
        "    signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"    it = iter(build(0, 2, 'process').map({step}))\n"
        f"    if {step == 'fns.double'}:\n"
        "        next(it)\n"
        "        print('ready', flush=True)\n"
        "    for x in it:\n"
        "        pass\n"
    )
    with _ready_script(script, data, stderr=True) as child:
        os.killpg(child.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
        err, ended = _read_to_end(child.stderr, 90.0)
        assert ended, f"stderr still open after 90 s; left: {_described(child.pid)}\n{err[-3000:]}"
        child.wait(timeout=60)
    assert "KeyboardInterrupt" in err
    assert err.count("Traceback (most recent call last)") == 1, err[-3000:]
    for noise in ("EOFError", "UnpicklingError", "Unclosed client session"):
        assert noise not in err, err[-3000:]
    assert _gone_within(child.pid, 15.0) == []


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="needs /dev/shm")
@pytest.mark.parametrize("engine", ["thread", "process"])
def test_a_worker_killed_outright_leaves_nothing_and_the_next_run_is_healthy(
    data: Path, engine: str
) -> None:
    """One worker SIGKILLed mid-run (the out-of-memory killer picks the largest process):
    ``WorkerCrashed``; then no segment of the run in ``/dev/shm``, no process left, and a
    new pipeline in the same process runs to the end."""
    import multiprocessing

    from zephon import Dataset, Pipeline, StaticMixtureWorkSource, WorkerCrashed

    before = set(os.listdir("/dev/shm"))
    ds = Dataset.from_path("a", str(data))

    def pipe(fn: Any) -> Pipeline:
        ws = StaticMixtureWorkSource([ds], seed=1, shuffle="none", stop_after_passes=1)
        return Pipeline(ws, rank=0, world_size=1, engine=engine).map(fn, processes=2)

    with pytest.raises(WorkerCrashed):
        for _ in pipe(fns.picture_or_sigkill_on_300):
            pass
    assert multiprocessing.active_children() == []
    assert {n for n in os.listdir("/dev/shm") if n.startswith("zph")} - before == set()
    assert sum(1 for _ in pipe(fns.picture)) == ds.num_samples


@contextlib.contextmanager
def _ready_script(script: str, data: Path, stderr: bool = False) -> Any:
    """``script`` run on ``data`` in a session of its own (its own process group), once it
    has printed ``ready``."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    err = subprocess.PIPE if stderr else subprocess.DEVNULL
    argv = [sys.executable, "-c", script, str(data)]
    with subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    ) as child:
        try:
            assert child.stdout is not None
            ready, _, _ = select.select([child.stdout], [], [], 90.0)
            assert ready, "the script said nothing for 90 s"
            assert child.stdout.readline().strip() == "ready"
            yield child
        except BaseException:  # a failed test must not wait forever on a running script
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            raise


def _trackers_of(pids: list[int]) -> list[int]:
    """The resource trackers started by any of ``pids``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            argv = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if parent in pids and b"resource_tracker" in argv:
            found.append(int(stat.parent.name))
    return found


def _gone_within_pid(pid: int, timeout_s: float) -> None:
    import select

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)


def _read_to_end(stream: Any, timeout_s: float) -> tuple[str, bool]:
    """What ``stream`` (a text pipe) gives until every writer has closed it, and whether they
    all did within ``timeout_s`` (a process that keeps it open is then named by the caller)."""
    import time

    deadline = time.monotonic() + timeout_s
    fd, chunks = stream.fileno(), []
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks).decode(errors="replace"), True
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace"), False


def _described(sid: int) -> list[str]:
    """The processes of session ``sid`` and those its members started elsewhere (a resource
    tracker in a session of its own), as ``pid state cmdline``."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            argv = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
        except OSError:
            continue
        if int(fields[3]) == sid or int(fields[1]) == sid or "zephon" in argv:
            try:  # signals blocked and ignored: a Ctrl-C that cannot arrive
                status = (stat.parent / "status").read_text().splitlines()
                masks = " ".join(x for x in status if x.startswith(("SigBlk", "SigIgn")))
            except OSError:
                masks = ""
            out.append(f"{stat.parent.name} {fields[0]} {masks} {argv}")
    return out


def _gone_within(pgid: int, timeout_s: float) -> list[int]:
    """Processes of group ``pgid`` still running after waiting up to ``timeout_s`` for each."""
    import select
    import time

    deadline = time.monotonic() + timeout_s
    for pid in _live_in_group(pgid):
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue
        try:
            select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        finally:
            os.close(fd)
    return _live_in_group(pgid)


def _live_in_group(pgid: int) -> list[int]:
    """Processes of group ``pgid`` that are still running (zombies, dead but not yet reaped
    by init, do not count)."""
    live = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            live.append(int(stat.parent.name))
    return live


S3_SCRIPT = """
import asyncio, json, sys, warnings
from tests import pipeline_fns as fns
from zephon import Dataset, Pipeline, StaticMixtureWorkSource

warnings.simplefilter("always")
opts = json.loads(sys.argv[2])
ds = Dataset.from_path("d", sys.argv[1], storage_options=opts)

def pipe():
    return Pipeline(StaticMixtureWorkSource([ds], seed=1), rank=0, world_size=1, lanes=2)

for i, x in enumerate(pipe()):  # break
    if i == 3:
        break
p = pipe(); it = iter(p); next(it); p.close()  # close() with a live iterator
try:  # an error from an operator
    for x in pipe().map(fns.fail_on_13):
        pass
except KeyError:
    pass
p = pipe(); it = iter(p); state = [next(it) for _ in range(5)] and p.checkpoint(); it.close()
q = pipe(); q.restore(state); n = sum(1 for _ in q)  # a restore, run to the end

async def early():
    async for x in pipe():
        break
asyncio.run(early())
print("done", n)
"""


@pytest.mark.integration
@pytest.mark.timeout(60)
def test_no_warning_is_left_after_break_close_error_or_restore_on_s3(
    s3_endpoint: Any, s3_bucket: str, tmp_path: Path
) -> None:
    client = s3_endpoint.client()
    for s in range(3):
        body = "".join(json.dumps({"id": s * 100 + i}) + "\n" for i in range(100))
        client.put_object(Bucket=s3_bucket, Key=f"d/p{s}.jsonl", Body=body.encode())
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "always"}
    out = subprocess.run(
        [
            sys.executable,
            "-W",
            "always",
            "-c",
            S3_SCRIPT,
            f"s3://{s3_bucket}/d/",
            json.dumps(s3_endpoint.storage_options()),
        ],
        capture_output=True,
        text=True,
        timeout=50,
        env=env,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["done", "295"]
    for sign in ("Unclosed", "Task was destroyed", "never awaited", "ResourceWarning"):
        assert sign not in out.stderr, out.stderr[-3000:]

"""The child-process engine: the whole pipeline in a process of its own, batches back through
shared memory.

``Pipeline(..., engine="process")`` runs the event loop, every stage and every operator in a
child process (started with ``spawn``: the pipeline and its functions must pickle). Only
finished items cross to the trainer: each numeric numpy array of 64 KiB or more is written
into one of a few shared-memory slots and copied out here with a single ``memcpy`` (never
pickled); the rest of the item (strings, small values and arrays) travels pickled beside it,
with the item's checkpoint. The trainer's interpreter lock is then spent on the training step
alone: a consumer that holds the GIL no longer slows fetching and decoding, and theirs no
longer slows it.

Each item comes with the JSON checkpoint of "everything up to it received": ``checkpoint()``
here is exact however far ahead the child is. ``stats()`` asks the child; its errors are
raised here with their type, message, notes and its traceback (a note). It exits with us.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import fcntl
import gc
import multiprocessing as mp
import pickle
import queue
import signal
import sys
import threading
import traceback
import weakref
from collections.abc import Iterator
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import cloudpickle
import numpy as np

from zephon.engine import janitor
from zephon.engine.pool import refuse_unguarded
from zephon.errors import ConfigError, WorkerCrashed, ZephonError
from zephon.pipeline.bridge import new_loop
from zephon.pipeline.placement import check_main_can_start_workers
from zephon.pipeline.slots import Slots, join, split

__all__ = ["ProcessEngine"]

AHEAD = 16  # items queued for the data pipe at most (and about AHEAD_BYTES of them)
AHEAD_BYTES = 16 << 20
_PIPE_BYTES = 1 << 20
_RECEIVED = 2  # items received ahead of the consumer in the parent


class _Sender:
    """Sends the child's messages from a thread of its own, at most ``AHEAD`` (about
    ``AHEAD_BYTES``) queued. Sent from the event loop, a message that found the pipe full
    blocked the whole pipeline until the consumer came back: a consumer that slept between
    items then waited for any pause of the child longer than the item or two a pipe holds."""

    def __init__(self, data: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.data, self.loop = data, loop
        self.queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self.held = [0, 0]  # messages, bytes queued
        self.room = asyncio.Event()
        self.room.set()
        self.broken = False
        self.thread = threading.Thread(target=self._run, name="zephon-send", daemon=True)
        self.thread.start()

    async def send(self, payload: bytes) -> None:
        while self.held[0] >= AHEAD or (self.held[0] and self.held[1] >= AHEAD_BYTES):
            self.room.clear()
            await self.room.wait()
        self.held[0], self.held[1] = self.held[0] + 1, self.held[1] + len(payload)
        self.queue.put(payload)

    def _sent(self, size: int) -> None:
        self.held[0], self.held[1] = self.held[0] - 1, self.held[1] - size
        self.room.set()

    def _run(self) -> None:
        while (payload := self.queue.get()) is not None:
            if not self.broken:
                try:
                    self.data.send_bytes(payload)
                except OSError:  # the parent closed its end: it wants nothing more
                    self.broken = True
            with contextlib.suppress(RuntimeError):  # the loop is closed
                self.loop.call_soon_threadsafe(self._sent, len(payload))

    def finish(self, last: bytes | None = None) -> None:
        """Send ``last`` after everything queued, and wait until all of it is sent."""
        if last is not None:
            self.queue.put(last)
        self.queue.put(None)
        self.thread.join()


def _start_without_sigint(proc: Any) -> None:
    """Start ``proc`` with SIGINT blocked: Ctrl-C is the parent's to handle (it stops the
    child). The child inherits the mask and then ignores the signal (interrupted while it
    started, it printed a traceback of its own beside the parent's)."""
    if not hasattr(signal, "pthread_sigmask"):
        proc.start()
        return
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        proc.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _child(blob: bytes, data: Connection, control: Connection, progress: bool) -> None:
    """The child: run the pipeline on this thread's event loop (one thread: no handing the
    interpreter lock back and forth), send each item with its checkpoint."""
    # The loop (fetching, delivery) and the helper thread (in-process steps) share this
    # process's interpreter lock: hand it over often, so items leave without waiting for a
    # 5 ms slice of a step (measured: 35 -> 44 batches/s for a GIL-holding trainer).
    sys.setswitchinterval(0.0005)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops this process
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    pipe = pickle.loads(blob)
    # This process is ours and holds nothing but the pipeline: what is alive once it is
    # unpickled (modules, the user's steps, a tokenizer) lives as long as the process, so
    # the collector's full passes need not walk it again (a process that imports torch
    # spends ~0.1 s in each such pass; benchmarks/first_sample.py --torch [--freeze]).
    gc.freeze()
    # Here it runs in-loop; the parent turns items into tensors (``convert``) itself.
    pipe.spec = dataclasses.replace(pipe.spec, engine="thread", convert=None)
    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(_produce(pipe, data, control, progress))


async def _produce(pipe: Any, data: Connection, control: Connection, progress: bool) -> None:
    loop = asyncio.get_running_loop()
    slots = Slots(loop)
    me = asyncio.current_task()
    assert me is not None

    def serve_control() -> None:  # frees slots, answers stats, stops on request or EOF
        while True:
            try:
                kind, arg = control.recv()
            except (EOFError, OSError):
                kind, arg = "stop", None
            if kind == "free":
                slots.release(arg)
            elif kind == "stats":
                control.send(pipe.stats())
            else:
                loop.call_soon_threadsafe(stop)
                return

    def stop() -> None:  # the parent wants nothing more: no waiting for it, no more items
        slots.stop()
        if not finishing:
            me.cancel()

    threading.Thread(target=serve_control, name="zephon-control", daemon=True).start()
    sender = _Sender(data, loop)
    last: bytes | None = None
    finishing = False
    try:
        async with contextlib.aclosing(pipe.aiter(progress)) as items:
            async for item in items:
                arrays: list[np.ndarray] = []
                rest = split(item, arrays)
                slot, name = await slots.write(arrays, rest) if arrays else (-1, "")
                await sender.send(pickle.dumps(("item", slot, name, rest, pipe.checkpoint()), 5))
        last = pickle.dumps(("end", pipe.checkpoint(), pipe.stats()), 5)
    except asyncio.CancelledError:
        pass
    except BaseException as exc:
        text = "".join(traceback.format_exception(exc))
        try:
            last = pickle.dumps(("error", exc, text), 5)
        except Exception:
            last = pickle.dumps(("error", None, text), 5)
    finally:
        finishing = True
        await asyncio.to_thread(sender.finish, last)
        await slots.settled()
        slots.close()


_OPEN: weakref.WeakSet[ProcessEngine] = weakref.WeakSet()


@atexit.register  # after multiprocessing's own hook was registered: so it runs before it
def _close_open() -> None:
    for engine in list(_OPEN):
        engine.close()


def _widen(pipe: Connection) -> None:
    """The data pipe's buffer raised from 64 KiB to 1 MiB (Linux's default cap for a user),
    so an item of text (100-200 KB a batch) crosses in one write and one read, not three
    of each with a wake-up between."""
    with contextlib.suppress(AttributeError, OSError):  # not Linux, or a lower cap
        fcntl.fcntl(pipe.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)


class ProcessEngine:
    """One run of a pipeline in a child process, iterated here (see the module docstring).
    A thread receives items (unpickled, arrays copied out) a couple ahead: the consumer does
    not wait 0.1-0.5 ms a batch for that, it happens while it works on the last one."""

    def __init__(self, pipeline: Any, progress: bool) -> None:
        if mp.current_process().daemon:
            raise ConfigError(
                "engine='process' cannot start its process from a daemonic process (a "
                "DataLoader worker is one): use engine='thread' there, the workers are "
                "processes already"
            )
        check_main_can_start_workers()
        refuse_unguarded()  # the child imports the script: it would run the pipeline again
        try:
            # By value where the child could not import them: lambdas, closures, functions
            # of a __main__ (the child runs its own).
            blob = cloudpickle.dumps(pipeline, 5)
        except Exception as exc:
            raise ConfigError(
                "engine='process' runs the pipeline in a spawned process, so the pipeline "
                f"and its functions must serialise ({type(exc).__name__}: {exc}); a step "
                "holding a lock, a socket or an open file cannot"
            ) from exc
        janitor.ensure()  # the child's segments go with this process tree, however it ends
        ctx = mp.get_context("spawn")
        self._data, child_data = ctx.Pipe(duplex=False)
        _widen(self._data)
        self._control, child_control = ctx.Pipe()
        # Not a daemon: the child may start a worker pool of its own (processes=N). It ends
        # when its control pipe closes, and every engine still open at exit is closed first.
        self._proc = ctx.Process(
            target=_child, args=(blob, child_data, child_control, progress), name="zephon-pipeline"
        )
        self._segments: dict[int, SharedMemory] = {}  # each slot's segment, as last opened
        self._convert = pipeline.spec.convert
        self.final_stats: dict[str, Any] | None = None
        self.final_state: dict[str, Any] | None = None  # the checkpoint at the end
        self._received: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._room = threading.Semaphore(_RECEIVED)
        self._control_lock = threading.Lock()  # the receiver frees slots, stats() asks
        self._closing = False
        self._closed = False
        self._close_lock = threading.Lock()
        self._receiver = threading.Thread(target=self._receive, name="zephon-receive", daemon=True)
        # Open before it starts: a script that ends while another thread starts the child
        # (an async consumer cancelled then) closes it at exit instead of leaving it to read
        # a pipe that is gone. close() waits for the start to be over.
        self._ready = threading.Event()
        _OPEN.add(self)
        try:
            _start_without_sigint(self._proc)
            self._receiver.start()
        except BaseException:
            _OPEN.discard(self)
            self._closed = True
            self._data.close()
            self._control.close()
            raise
        finally:
            child_data.close()
            child_control.close()
            self._ready.set()

    def __iter__(self) -> Iterator[tuple[Any, dict[str, Any]]]:
        """Each item (converted as the pipeline says: tensors, say) with the checkpoint of
        everything up to it received."""
        convert = self._convert
        while True:
            kind, payload = self._received.get()
            self._room.release()
            if self._closing:  # closed from another thread: the iteration ends, no crash
                return
            if kind == "item":
                yield (payload[0] if convert is None else convert(payload[0])), payload[1]
            elif kind == "end":
                self.final_state, self.final_stats = payload
                return
            elif kind == "error":
                raise payload
            else:
                self._proc.join(timeout=5)
                raise WorkerCrashed(
                    f"the pipeline's process died (exit code {self._proc.exitcode})"
                ) from None

    def _receive(self) -> None:
        """The receiver thread: messages in order, as (kind, payload), into ``_received``;
        once closing, the rest read and dropped until the child has gone."""
        while True:
            if not self._closing:
                self._room.acquire()
            try:
                data = self._data.recv_bytes()
            except (EOFError, OSError):
                self._received.put(("died", None))
                return
            if self._closing:
                continue
            try:
                self._received.put(self._unpack(pickle.loads(data)))
            except Exception as exc:  # an item that does not unpickle here, say
                self._received.put(("error", exc))

    def _unpack(self, message: tuple[Any, ...]) -> tuple[str, Any]:
        if message[0] == "item":
            _, slot, name, rest, checkpoint = message
            item = rest if slot < 0 else join(rest, self._buffer(slot, name))
            if slot >= 0:
                self._send_control(("free", slot))
            return "item", (item, checkpoint)
        if message[0] == "end":
            return "end", message[1:]
        return "error", _rebuilt(message[1], message[2])

    def _send_control(self, message: tuple[str, Any]) -> None:
        with self._control_lock, contextlib.suppress(OSError):
            self._control.send(message)

    def _buffer(self, slot: int, name: str) -> memoryview:
        shm = self._segments.get(slot)
        if shm is None or shm.name != name:
            if shm is not None:  # the slot grew: the child unlinked the old segment, we unmap it
                with contextlib.suppress(BufferError):
                    shm.close()
            # The child owns it (a spawned child shares our resource tracker, which unlinks
            # whatever the child leaves behind if it is killed).
            shm = self._segments[slot] = SharedMemory(name=name)
        assert shm.buf is not None
        return shm.buf

    def stats(self) -> dict[str, Any]:
        """The child's counters, asked now (the last ones once it has finished)."""
        if self.final_stats is not None or not self._proc.is_alive():
            return self.final_stats or {}
        with self._control_lock:
            try:
                self._control.send(("stats", None))
                if self._control.poll(10):
                    stats: dict[str, Any] = self._control.recv()
                    return stats
            except (EOFError, OSError):
                pass
        return self.final_stats or {}

    def close(self) -> None:
        """Stop the child and release the shared memory (once: from any thread, any number
        of times; a second caller waits for the first)."""
        self._ready.wait()  # a start under way on another thread
        with self._close_lock:
            if not self._closed:
                self._close()
                self._closed = True

    def _close(self) -> None:
        _OPEN.discard(self)
        self._closing = True
        self._send_control(("stop", None))
        self._room.release()  # the receiver drains the data pipe until the child has gone
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._receiver.join(timeout=10)  # at the child's end (a process it left may hold it)
        for shm in self._segments.values():
            shm.close()
            with contextlib.suppress(FileNotFoundError):
                shm.unlink()  # gone already unless the child could not clean up
        self._segments.clear()
        if not self._receiver.is_alive():
            self._data.close()
        self._control.close()


def _rebuilt(exc: BaseException | None, text: str) -> BaseException:
    """The child's exception for raising here, its traceback as a note."""
    if exc is None:
        exc = ZephonError("the pipeline's process raised an exception that does not pickle")
    exc.add_note(f"zephon: raised in the pipeline's process:\n{text.rstrip()}")
    return exc

"""Top-level functions for process-pool tests (workers import them by module name)."""

from __future__ import annotations

import os
from typing import Any


def double(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "double": sample["id"] * 2, "pid": 0}


def keep_even(sample: dict[str, Any]) -> bool:
    return sample["id"] % 2 == 0


def fail_on_13(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 13:
        raise KeyError(f"no luck for {sample['id']}")
    return sample


def die_on_7(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 7:
        os._exit(3)  # a worker killed mid-task
    return sample


def drop_multiples_of_5(sample: dict[str, Any]) -> dict[str, Any] | None:
    return None if sample["id"] % 5 == 0 else sample


async def echo_some(stream: Any) -> Any:
    """A stateless custom op: none, one or two outputs per input."""
    async for sample in stream:
        if sample["id"] % 7 == 0:
            continue
        yield sample
        if sample["id"] % 3 == 0:
            yield {**sample, "id": -sample["id"] - 1}


class Delay:
    """A stateful custom op: a delay line of two samples that numbers its outputs; its state
    is the two samples held and the count."""

    def __init__(self) -> None:
        self.held: list[dict[str, Any]] = []
        self.count = 0

    def state(self) -> dict[str, Any]:
        return {"held": [dict(h) for h in self.held], "count": self.count}

    def restore(self, state: dict[str, Any]) -> None:
        self.held, self.count = [dict(h) for h in state["held"]], state["count"]

    def _out(self) -> dict[str, Any]:
        oldest = self.held.pop(0)
        self.count += 1  # updated before the yield: state() right after it must include it
        return {"id": (self.count, oldest["id"])}

    async def __call__(self, stream: Any) -> Any:
        async for sample in stream:
            self.held.append({"id": sample["id"]})
            if len(self.held) > 2:
                yield self._out()
        while self.held:
            yield self._out()


def interrupt_on_13(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 13:
        raise KeyboardInterrupt
    return sample


def exit_on_13(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["id"] == 13:
        raise SystemExit(7)
    return sample


def undelay(sample: dict[str, Any]) -> dict[str, Any]:
    """The input id back out of :class:`Delay`'s ``(count, id)`` output."""
    return {"id": sample["id"][1]}


def as_tokens(sample: dict[str, Any]) -> dict[str, Any]:
    """A document of ``id % 5 + 1`` tokens, each ``id + 1`` (0 is padding)."""
    return {"input_ids": [sample["id"] + 1] * (sample["id"] % 5 + 1)}


def die_once_on_7(marker: str, sample: dict[str, Any]) -> dict[str, Any]:
    """Kills its process at sample 7 the first time only (``marker`` records that it did)."""
    if sample["id"] == 7 and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write("died")
        os._exit(3)
    return sample


def drop_40_percent_of_a(sample: dict[str, Any]) -> bool:
    """Keeps all of dataset b (ids >= 100,000) and 60% of dataset a."""
    return sample["id"] >= 100_000 or sample["id"] % 5 >= 2


def reject_13(sample: dict[str, Any]) -> dict[str, Any]:
    """Bad input for sample 13: a ``FormatError``, which ``on_error="skip"`` may skip."""
    from zephon.errors import FormatError

    if sample["id"] == 13:
        raise FormatError("record 13 is malformed")
    return sample


def id_of(sample: dict[str, Any]) -> int:
    return int(sample["id"])


def as_text(sample: dict[str, Any]) -> dict[str, Any]:
    """The id as the sample's text (for tokenize steps)."""
    return {**sample, "text": f"doc {sample['id']}"}


def arrays(seed: int) -> dict[str, Any]:
    """A result with arrays of every kind a step returns: large and small, C and Fortran
    order, a strided view, pyarrow, alongside plain values."""
    import numpy as np
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    image = rng.integers(0, 256, (224, 224, 3), dtype=np.uint8)
    return {
        "images": [image, image[::-1].copy()],
        "floats": np.asfortranarray(rng.random((300, 200))),
        "strided": rng.random((400, 400))[::2, ::3],
        "small": np.arange(10, dtype=np.int32),
        "table": pa.array(rng.integers(0, 1 << 40, 200_000)),
        "text": "x" * 100,
        "seed": seed,
    }


def pack_then_exit(prefix: str) -> None:
    """Write a result's segment as a worker does, then die before sending it."""
    from zephon.engine import shm

    shm.pack(arrays(0), prefix)
    os._exit(3)


def describe(items: list[Any]) -> list[tuple[str, int, str]]:
    """What a worker received: each value's type, size and digest (nested dicts included)."""
    import hashlib

    out = []
    for item in items:
        for value in item.values():
            value = value["bytes"] if isinstance(value, dict) else value
            digest = hashlib.sha1(value).hexdigest() if isinstance(value, bytes) else ""
            out.append((type(value).__name__, len(value) if digest else 0, digest))
    return out


def image_of(sample: dict[str, Any]) -> dict[str, Any]:
    """A 224x224x3 image for the sample (150 KB: it crosses through shared memory)."""
    import numpy as np

    if sample["id"] == 977:
        raise KeyError("no image for 977")
    return {"id": sample["id"], "image": np.full((224, 224, 3), sample["id"] % 251, np.uint8)}


def with_pass(sample: dict[str, Any]) -> dict[str, Any]:
    """The sample with the pass it was drawn in, as a step sees it."""
    import zephon

    return {**sample, "pass": zephon.sample_pass()}


class OnlyInChild:
    """Pickles anywhere, unpickles only in a child process (not in the test's own)."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _only_in_child, ()


def _only_in_child() -> OnlyInChild:
    import multiprocessing

    if multiprocessing.parent_process() is None:
        raise ValueError("this object unpickles only in a child process")
    return OnlyInChild()


def with_only_in_child(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "odd": OnlyInChild()}


def grown(sample: dict[str, Any]) -> dict[str, Any]:
    """An array of (id + 4) x 256 KiB: each item of a run in id order outgrows the last."""
    import numpy as np

    return {"id": sample["id"], "x": np.full((sample["id"] + 4) << 18, sample["id"], np.uint8)}


def picture(sample: dict[str, Any]) -> dict[str, Any]:
    """A 224x224x3 image for every sample (150 KB: it crosses through shared memory)."""
    import numpy as np

    return {"id": sample["id"], "image": np.full((224, 224, 3), sample["id"] % 251, np.uint8)}


class SlowToStart:
    """A step that takes seconds to arrive in a child process (as heavy imports do), and
    says ``ready`` on stdout when it starts arriving there."""

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        return sample

    def __reduce__(self) -> tuple[Any, ...]:
        return _slow_to_start, ()


def _slow_to_start() -> SlowToStart:
    import multiprocessing
    import time

    if multiprocessing.parent_process() is not None:
        print("ready", flush=True)
        time.sleep(3.0)  # an import that takes long, not a wait for anything
    return SlowToStart()


def picture_or_sigkill_on_300(sample: dict[str, Any]) -> dict[str, Any]:
    """A picture, except that sample 300 kills its worker as the out-of-memory killer does."""
    import os
    import signal

    if sample["id"] == 300:
        os.kill(os.getpid(), signal.SIGKILL)
    return picture(sample)


class Filled:
    """A step giving each sample an array of ``nbytes`` bytes filled with its id."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes

    def __call__(self, sample: dict[str, Any]) -> dict[str, Any]:
        import numpy as np

        return {"id": sample["id"], "x": np.full(self.nbytes, sample["id"], np.uint8)}

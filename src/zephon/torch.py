"""torch adapters: tensors out of batches, and an ``IterableDataset`` with state dicts.

Needs the ``torch`` extra. ``to_torch_dataset()`` works with ``DataLoader(batch_size=None)``
and with torchdata's ``StatefulDataLoader``, whose ``state_dict``/``load_state_dict`` reach
the pipeline's :meth:`~zephon.pipeline.Pipeline.checkpoint` and ``restore``.

With ``num_workers=W``, each DataLoader worker runs the lanes of its share: worker ``w`` of
rank ``r`` is rank ``r * W + w`` of ``world_size * W`` for the pipeline, so ``lanes`` must be a
multiple of ``world_size * W``. Each worker's state covers its lanes; restoring with the same
``W`` continues exactly (``StatefulDataLoader`` keeps one state per worker). To restore with
another ``W`` or world size (``StatefulDataLoader`` refuses another worker count), join the
states with :func:`loader_checkpoint` and turn the result into a state for the new loader
with :func:`loader_state`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import tempfile
import time
import uuid
import warnings
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

__all__ = [
    "LoaderMetrics",
    "ZephonIterableDataset",
    "loader_checkpoint",
    "loader_state",
    "to_tensors",
]

LOADED = "zephon_loaded"  # a worker state as loader_state() gave it (see loader_checkpoint)


BY_VALUE_BYTES = 1 << 20  # a worker's tensors up to this size cross to the trainer by value


class _ByValue(torch.Tensor):
    """A small tensor a ``DataLoader`` worker sends to the trainer's process by value: it
    arrives as a plain tensor built from its bytes. Sent as torch sends tensors (its memory
    shared, the file descriptor handed over through a fresh authenticated connection per
    tensor), a batch of small tensors cost the trainer about half a millisecond of CPU each,
    many times copying their bytes; a batch's large tensors (images) still go that way."""

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return (torch.from_numpy, (self.numpy(),))


def to_tensors(value: Any, pin_memory: bool = False, by_value: int = 0) -> Any:
    """numpy arrays (also inside dicts, lists, tuples) as tensors sharing their memory;
    ``pin_memory`` pins them where there is an accelerator to copy them to (as ``DataLoader``
    does: without one, a warning once and plain tensors). Unpinned tensors of at most
    ``by_value`` bytes are sent by value when pickled (see :class:`_ByValue`)."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if pin_memory and _pinnable():
            return tensor.pin_memory()
        return tensor.as_subclass(_ByValue) if tensor.nbytes <= by_value else tensor
    if isinstance(value, dict):
        return {k: to_tensors(v, pin_memory, by_value) for k, v in value.items()}
    if isinstance(value, list | tuple) and value and isinstance(value[0], np.ndarray):
        return type(value)(to_tensors(v, pin_memory, by_value) for v in value)
    return value


@functools.cache
def _pinnable() -> bool:
    """Whether this process has an accelerator, for which pinned memory is made (torch raises
    ``Cannot access accelerator device`` mid-run otherwise)."""
    accelerator = getattr(torch, "accelerator", None)
    found = bool(accelerator.is_available() if accelerator else torch.cuda.is_available())
    if not found:
        warnings.warn(
            "pin_memory=True but no accelerator is available: tensors are not pinned",
            RuntimeWarning,
            stacklevel=2,
        )
    return found


class ZephonIterableDataset(IterableDataset[Any]):
    """A pipeline as a torch ``IterableDataset`` that checkpoints through state dicts."""

    def __init__(self, pipeline: Pipeline, pin_memory: bool = False) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.pin_memory = pin_memory
        self._active: Pipeline | None = None  # this worker's share, once iterating
        self._pending: dict[str, Any] | None = None  # a state to restore into it
        self._prepared: Pipeline | None = None  # the share restored before its iteration
        # Iterated by DataLoader workers, the copy in the trainer's process never moves: a
        # worker leaves this marker, so that copy refuses to checkpoint the stream's start.
        self._marker = os.path.join(tempfile.gettempdir(), f"zephon-dataset-{uuid.uuid4().hex}")
        weakref.finalize(self, _remove_marker, self._marker, os.getpid())

    def _share(self) -> Pipeline:
        """The pipeline for this DataLoader worker: a share of this rank's lanes."""
        info = get_worker_info()
        if info is None or info.num_workers <= 1:
            return self.pipeline
        pipe, workers = self.pipeline, info.num_workers
        per_rank = len(pipe.my_lanes)
        if per_rank % workers:
            fit = pipe.world_size * workers * -(-per_rank // workers)
            raise ConfigError(
                f"DataLoader(num_workers={workers}) needs lanes to be a multiple of world_size "
                f"x num_workers ({pipe.world_size} x {workers}); this rank owns {per_rank} of "
                f"{pipe.lanes} lanes: pass lanes={fit} to Pipeline(...), or fewer workers"
            )
        return pipe.for_rank(pipe.rank * workers + info.id, pipe.world_size * workers)

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None and not os.path.exists(self._marker):
            with open(self._marker, "w"):  # read in a worker: see state_dict
                pass
        pipe = self._active = self._restored()
        self._prepared = None
        by_value = BY_VALUE_BYTES if get_worker_info() is not None else 0
        for item in pipe.iter():
            yield to_tensors(item, self.pin_memory, by_value)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint (JSON) of this worker's share, for ``StatefulDataLoader``.

        Raises:
            ConfigError: called in the trainer's process while DataLoader worker processes
                read the pipeline: this copy has received nothing, and its state would
                restart the stream.
        """
        if self._pending is not None:  # not iterated since: the restored share's state
            self._prepared = self._active = self._restored()
            return self._prepared.checkpoint()
        if self._active is None and get_worker_info() is None and os.path.exists(self._marker):
            raise ConfigError(
                "state_dict() of a dataset that DataLoader worker processes are reading: "
                "the position lives in the workers, and this copy would restart the stream. "
                "Use torchdata's StatefulDataLoader and its state_dict() (one state per "
                "worker; zephon.torch.loader_checkpoint joins them), or num_workers=0"
            )
        return (self._active or self._share()).checkpoint()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` when the next iteration starts."""
        self._pending, self._prepared = state.get(LOADED, state), None

    def _restored(self) -> Pipeline:
        """This worker's share, with a pending state restored into it. A state asked for
        before the iteration starts is then this share's (its lanes, in the restored
        layout), not the whole checkpoint loaded: joined with the other workers' states, that
        one put back lanes they had moved on from."""
        if self._prepared is not None:
            return self._prepared
        pipe = self._share()
        if self._pending is not None:
            pipe.restore(self._pending)
            self._pending = None
        return pipe


def _worker_state(checkpoint: dict[str, Any], w: int, workers: int, pipeline: Any) -> Any:
    """What worker ``w`` restores from; the loader keeps it as the worker's state until the
    worker yields. With the pipeline, the worker's share restored (its own lanes, in the new
    layout); without, the whole checkpoint, marked as loaded (see :func:`loader_checkpoint`)."""
    if pipeline is None:
        return {LOADED: checkpoint}
    share = pipeline.for_rank(pipeline.rank * workers + w, pipeline.world_size * workers)
    share.restore(checkpoint)
    return share.checkpoint()


def _last_worker(
    checkpoint: dict[str, Any], workers: int, rank: int | None, world_size: int | None
) -> int:
    """The worker that yielded the checkpoint's last batch: the loader takes one batch of
    each live worker in turn, so the next is the first live worker that yielded the fewest
    (the pipeline's merge restarts its lanes the same way)."""
    if rank is None or world_size is None:
        from zephon.pipeline.ranks import default_rank

        rank, world_size = default_rank()
    from zephon.pipeline.state import lane_entries

    lanes, entries = checkpoint.get("lanes"), lane_entries(checkpoint)
    if not isinstance(lanes, int) or lanes % (world_size * workers):
        return workers - 1  # another layout: any order is exact
    per = lanes // (world_size * workers)
    counts, live = [], []
    for w in range(workers):
        first = (rank * workers + w) * per
        mine = [entries.get(str(lane), {}) for lane in range(first, first + per)]
        counts.append(sum(int(e.get("items", 0)) for e in mine))
        live.append(not all(e.get("ended") for e in mine))
    turn = [w for w in range(workers) if live[w]]
    if not turn:
        return workers - 1
    fewest = min(counts[w] for w in turn)
    return (next(w for w in turn if counts[w] == fewest) - 1) % workers


def _remove_marker(path: str, owner: int) -> None:
    if os.getpid() == owner:  # not a forked worker's copy of the dataset
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)


def loader_checkpoint(*states: dict[str, Any]) -> dict[str, Any]:
    """One pipeline checkpoint from ``StatefulDataLoader`` state dicts (any number of workers;
    several ranks' states together), or from pipeline checkpoints: every worker's lanes,
    joined with :meth:`~zephon.pipeline.Pipeline.merge_checkpoints`.

    Raises ``ConfigError`` for a state taken between snapshots
    (``snapshot_every_n_steps > 1``): its workers' states miss the batches since the last
    snapshot, which only a loader with the same workers can skip again."""
    found: list[dict[str, Any]] = []
    for state in states:
        if "zephon_checkpoint" in state or LOADED in state:
            found.append(state)
        elif "_snapshot" in state:
            if state.get("_steps_since_snapshot"):
                raise ConfigError(
                    f"this DataLoader state was taken {state['_steps_since_snapshot']} batches "
                    "after its last snapshot: its workers' states do not cover those batches. "
                    "Use StatefulDataLoader(..., snapshot_every_n_steps=1) (the default)"
                )
            workers = state["_snapshot"].get("_worker_snapshots", {})
            found.extend(w["dataset_state"] for w in workers.values() if w.get("dataset_state"))
        elif state.get("dataset_state"):
            found.append(state["dataset_state"])
        else:
            raise ConfigError(
                f"not a DataLoader state with a Zephon pipeline: keys {sorted(state)}"
            )
    if not found:
        raise ConfigError("loader_checkpoint: no pipeline state in these DataLoader states")
    from zephon.pipeline import Pipeline

    loaded = [s[LOADED] for s in found if LOADED in s]
    fresh = [s for s in found if LOADED not in s]
    if loaded and fresh and any(s.get("lanes") != fresh[0].get("lanes") for s in loaded):
        raise ConfigError(
            "a DataLoader worker has not yielded since its loader was restored into another "
            "lane count, and its state is still the whole checkpoint loaded: pass the "
            "pipeline to loader_state(checkpoint, num_workers, pipeline) when restoring"
        )
    # A worker that has not yielded since the restore holds the checkpoint as loaded: its
    # lanes have not moved, and the workers that have yielded overwrite theirs.
    return Pipeline.merge_checkpoints(loaded + fresh)


def loader_state(
    checkpoint: dict[str, Any], num_workers: int, pipeline: Any = None
) -> dict[str, Any]:
    """A ``StatefulDataLoader`` state dict that resumes ``checkpoint`` (see
    :func:`loader_checkpoint`) with ``num_workers`` workers: each worker restores its own
    lanes from it, exactly (a new lane count is re-laned, as
    :meth:`~zephon.pipeline.Pipeline.restore` does).

    ``pipeline``: the rank's :class:`~zephon.pipeline.Pipeline` (or its
    ``to_torch_dataset()``). Given, each worker's state is its own lanes restored, and the
    loader takes its next batch from the worker whose turn it was (the order is the
    uninterrupted run's when the layout is the checkpoint's). Without it, a state taken
    before every worker has yielded again can be joined only into the same lane count.
    """
    if isinstance(pipeline, ZephonIterableDataset):
        pipeline = pipeline.pipeline
    if not isinstance(num_workers, int) or num_workers < 0:
        raise ConfigError(f"loader_state: num_workers must be an int >= 0, got {num_workers!r}")
    fetcher = {"dataset_iter_state": None, "fetcher_ended": False}
    main = {
        "_sampler_iter_state": None,
        "_index_sampler_state": None,
        "_sampler_iter_yielded": 0,
        "_IterableDataset_len_called": None,
        "_shared_seed": None,
    }
    if num_workers == 0:
        return {
            **main,
            "_num_yielded": 0,
            "fetcher_state": fetcher,
            "dataset_state": checkpoint,
            "_iterator_finished": False,
        }
    workers = {
        f"worker_{w}": {
            "worker_id": w,
            "dataset_state": _worker_state(checkpoint, w, num_workers, pipeline),
            "fetcher_state": fetcher,
        }
        for w in range(num_workers)
    }
    where = (pipeline.rank, pipeline.world_size) if pipeline is not None else (None, None)
    snapshot = {
        "_snapshot_step": 0,
        "_last_yielded_worker_id": _last_worker(checkpoint, num_workers, *where),
        "_main_snapshot": {
            **main,
            "_num_workers": num_workers,
            "_base_seed": int(torch.empty((), dtype=torch.int64).random_().item()),
        },
        "_worker_snapshots": workers,
    }
    return {"_snapshot": snapshot, "_steps_since_snapshot": 0, "_iterator_finished": False}


class LoaderMetrics:
    """A pipeline's loader metrics, written to TensorBoard every ``every`` steps.

    Call :meth:`step` once per training step (it costs a counter increment between writes).
    Every ``every`` steps it writes, over the interval since the last write: training steps
    per second (``steps_per_s``), the share of the time the pipeline's output waited for its
    stages (``wait_share``: near 0, the loader keeps ahead of the trainer), data read in MB/s
    (``read_MBps``), and each stage's busy share (``busy/<stage>``); and, in all,
    ``requests``, ``retries``, ``throttles`` and the bytes in flight (``inflight_MB``).

    Args:
        pipe: the pipeline the training loop consumes.
        writer: a ``torch.utils.tensorboard.SummaryWriter`` (or anything with
            ``add_scalar(tag, value, step)``); default: one writing to ``log_dir``.
        log_dir: where the default writer writes (TensorBoard's default if ``None``).
        every: steps between writes.
        prefix: the tags' prefix.

    Example::

        metrics = LoaderMetrics(pipe, log_dir="runs/exp1", every=50)
        for step, batch in enumerate(pipe):
            ...  # train
            metrics.step(step)
    """

    def __init__(
        self,
        pipe: Pipeline,
        writer: Any = None,
        log_dir: str | None = None,
        every: int = 100,
        prefix: str = "loader/",
    ) -> None:
        if every < 1:
            raise ConfigError(f"LoaderMetrics: every must be >= 1, got {every}")
        if writer is None:
            from torch.utils.tensorboard import SummaryWriter

            writer = SummaryWriter(log_dir=log_dir)
        self.pipe, self.writer, self.every, self.prefix = pipe, writer, every, prefix
        self._last: dict[str, Any] | None = None
        self._count = 0
        self._since = (time.perf_counter(), 0)  # the last write: when, after how many steps

    def step(self, step: int) -> None:
        """Count a training step; write the metrics on every ``every``-th."""
        self._count += 1
        if self._count % self.every == 0:
            self.write(step)

    def write(self, step: int) -> None:
        """Write the metrics now, as of training step ``step``."""
        now = self.pipe.stats()
        if not now:
            return
        clock, steps = time.perf_counter(), self._count
        wall = max(1e-9, clock - self._since[0])
        last = self._last or {"elapsed_s": 0.0, "consumer_stall_s": 0.0}
        span = max(1e-9, now["elapsed_s"] - last["elapsed_s"])
        fetch, before = now["fetch"], (last.get("fetch") or {})
        read = fetch["bytes"] + fetch.get("scan_reused_bytes", 0)
        read -= before.get("bytes", 0) + before.get("scan_reused_bytes", 0)
        values = {
            "steps_per_s": (steps - self._since[1]) / wall,
            "wait_share": (now["consumer_stall_s"] - last["consumer_stall_s"]) / span,
            "read_MBps": read / 1e6 / span,
            "requests": fetch["requests"],
            "retries": fetch["retries"],
            "throttles": fetch["throttles"],
            "inflight_MB": fetch["inflight_bytes"] / 1e6,
        }
        stages_before = last.get("stages") or {}
        for name, stage in now.get("stages", {}).items():
            busy = stage["busy_s"] - stages_before.get(name, {}).get("busy_s", 0.0)
            values[f"busy/{name}"] = busy / span
        for tag, value in values.items():
            self.writer.add_scalar(self.prefix + tag, float(value), step)
        self._last, self._since = now, (clock, steps)

    def close(self) -> None:
        """Flush and close the writer."""
        self.writer.close()

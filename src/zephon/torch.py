"""torch adapters: tensors out of batches, and an ``IterableDataset`` with state dicts.

Needs the ``torch`` extra. ``to_torch_dataset()`` works with ``DataLoader(batch_size=None)``
and with torchdata's ``StatefulDataLoader``, whose ``state_dict``/``load_state_dict`` reach
the pipeline's :meth:`~zephon.pipeline.Pipeline.checkpoint` and ``restore``.

With ``num_workers=W``, each DataLoader worker runs the lanes of its share: worker ``w`` of
rank ``r`` is rank ``r * W + w`` of ``world_size * W`` for the pipeline, so ``lanes`` must be a
multiple of ``world_size * W``. Each worker's state covers its lanes; restoring with the same
``W`` continues exactly (``StatefulDataLoader`` keeps one state per worker).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from zephon.errors import ConfigError

if TYPE_CHECKING:
    from zephon.pipeline import Pipeline

__all__ = ["ZephonIterableDataset", "to_tensors"]


def to_tensors(value: Any, pin_memory: bool = False) -> Any:
    """numpy arrays (also inside dicts, lists, tuples) as tensors sharing their memory."""
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        return tensor.pin_memory() if pin_memory else tensor
    if isinstance(value, dict):
        return {k: to_tensors(v, pin_memory) for k, v in value.items()}
    if isinstance(value, list | tuple) and value and isinstance(value[0], np.ndarray):
        return type(value)(to_tensors(v, pin_memory) for v in value)
    return value


class ZephonIterableDataset(IterableDataset[Any]):
    """A pipeline as a torch ``IterableDataset`` that checkpoints through state dicts."""

    def __init__(self, pipeline: Pipeline, pin_memory: bool = False) -> None:
        super().__init__()
        self.pipeline = pipeline
        self.pin_memory = pin_memory
        self._active: Pipeline | None = None  # this worker's share, once iterating
        self._pending: dict[str, Any] | None = None  # a state to restore into it

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
        pipe = self._active = self._share()
        if self._pending is not None:
            pipe.restore(self._pending)
            self._pending = None
        for item in pipe.iter():
            yield to_tensors(item, self.pin_memory)

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint (JSON) of this worker's share, for ``StatefulDataLoader``."""
        if self._pending is not None:
            return self._pending
        return (self._active or self._share()).checkpoint()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict` when the next iteration starts."""
        self._pending = state

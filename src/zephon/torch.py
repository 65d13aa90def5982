"""torch adapters: tensors out of batches, and an ``IterableDataset`` with state dicts.

Needs the ``torch`` extra. ``to_torch_dataset()`` works with ``DataLoader(batch_size=None)``
and with torchdata's ``StatefulDataLoader``, whose ``state_dict``/``load_state_dict`` reach
the pipeline's :meth:`~zephon.pipeline.Pipeline.checkpoint` and ``restore``. Use
``num_workers=0``: Zephon runs its own concurrency and process pool, and every DataLoader
worker would otherwise replay the whole stream.
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

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        if info is not None and info.num_workers > 1:
            raise ConfigError(
                "use num_workers=0 with a Zephon dataset: the pipeline has its own concurrency "
                "and worker pool, and each DataLoader worker would replay the whole stream"
            )
        for item in self.pipeline.iter():
            yield to_tensors(item, self.pin_memory)

    def state_dict(self) -> dict[str, Any]:
        return self.pipeline.checkpoint()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pipeline.restore(state)

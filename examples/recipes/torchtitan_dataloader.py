"""A dataloader for a torchtitan-style trainer: an iterable with ``state_dict()`` and
``load_state_dict()`` (torch's ``Stateful`` protocol), saved with the model in the trainer's
own checkpoint and resumed exactly, DataLoader worker processes included.

The trainer's checkpointer calls ``state_dict()`` on everything it saves; the loader's state
is Zephon's JSON checkpoint of what the trainer consumed (``loader_checkpoint``), keyed by
data-parallel rank, as torchtitan keys its dataloader state. ``load_state_dict()`` hands each
DataLoader worker its own part (``loader_state``).

    python examples/recipes/torchtitan_dataloader.py
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.torch import loader_checkpoint, loader_state


class ZephonDataLoader(Stateful):
    """A Zephon pipeline behind a ``StatefulDataLoader``, checkpointed as JSON."""

    def __init__(self, pipe: Pipeline, dp_rank: int = 0, num_workers: int = 2) -> None:
        self.pipe, self.key, self.workers = pipe, f"dp_rank_{dp_rank}", num_workers
        self.loader = StatefulDataLoader(
            pipe.to_torch_dataset(),
            batch_size=None,
            num_workers=num_workers,
            multiprocessing_context="fork" if num_workers else None,
        )

    def __iter__(self) -> Iterator[Any]:
        return iter(self.loader)

    def state_dict(self) -> dict[str, Any]:
        return {self.key: json.dumps(loader_checkpoint(self.loader.state_dict()))}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        checkpoint = json.loads(state_dict[self.key])
        self.loader.load_state_dict(loader_state(checkpoint, self.workers, self.pipe))


def build() -> Pipeline:
    docs = [{"text": f"document {i} " * (1 + i % 9)} for i in range(400)]
    ds = Dataset.from_records("docs", docs, samples_per_shard=50)
    ws = StaticMixtureWorkSource([ds], seed=2, shuffle="global")
    return Pipeline(ws, rank=0, world_size=1, lanes=4).tokenize("bytes").pack_sequences(32).batch(4)


def run(path: Path, stop_at: int | None, resume: bool) -> list[list[int]]:
    """Train (here: record the batches) until ``stop_at``, saving the trainer's checkpoint
    there; or resume from it."""
    model = torch.nn.Linear(4, 4)
    loader = ZephonDataLoader(build())
    if resume:
        saved = torch.load(path, weights_only=True)
        model.load_state_dict(saved["model"])
        loader.load_state_dict(saved["dataloader"])
    seen = []
    for step, batch in enumerate(loader, 1):
        seen.append(batch["input_ids"][:, 0].tolist())
        if step == stop_at:
            torch.save({"model": model.state_dict(), "dataloader": loader.state_dict()}, path)
            break
    return seen


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "step-12.pt"
        whole = run(path, None, False)
        head = run(path, 12, False)
        rest = run(path, None, True)
        assert head + rest == whole, "the resumed run differs"
        print(f"{len(whole)} batches through 2 DataLoader workers; resumed exactly")

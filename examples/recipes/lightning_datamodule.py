"""PyTorch Lightning: a ``LightningDataModule`` over a Zephon pipeline, resumed exactly
through Lightning's own checkpoint.

Lightning fetches a batch ahead of the step that uses it, so the loader's own state at a
checkpoint already counts one batch the model has not seen. The data module therefore keeps
the loader's state after each batch (a few hundred bytes of JSON) and saves, in Lightning's
checkpoint (``state_dict()``), the state after the last batch a step completed; on
``fit(ckpt_path=...)`` the loader starts from it, so a job killed after its last checkpoint
goes on with the very next batch.

    python examples/recipes/lightning_datamodule.py
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.torch import loader_checkpoint, loader_state

STEPS, SAVE_EVERY = 24, 10


class ZephonDataModule(L.LightningDataModule):
    def __init__(self) -> None:
        super().__init__()
        docs = [{"text": f"document {i} " * (1 + i % 7)} for i in range(300)]
        ds = Dataset.from_records("docs", docs, samples_per_shard=50)
        ws = StaticMixtureWorkSource([ds], seed=3, shuffle="global", stop_after_passes=None)
        self.pipe = (
            Pipeline(ws, rank=0, world_size=1, lanes=2)
            .tokenize("bytes")
            .pack_sequences(32)
            .batch(4)
            .to_training()
        )

        self.restored: dict[str, Any] | None = None
        self.states: dict[int, dict[str, Any]] = {}  # batch number -> loader state after it

    def train_dataloader(self) -> Any:
        loader = StatefulDataLoader(self.pipe.to_torch_dataset(), batch_size=None)
        first = 0
        if self.restored is not None:
            loader.load_state_dict(loader_state(self.restored["loader"], 0, self.pipe))
            first = self.restored["batches"]
        return self._batches(loader, first)

    def _batches(self, loader: StatefulDataLoader, first: int) -> Any:
        for number, batch in enumerate(loader, first + 1):
            self.states[number] = loader_checkpoint(loader.state_dict())
            self.states.pop(number - 4, None)  # Lightning is at most a batch or two behind
            yield batch

    def state_dict(self) -> dict[str, Any]:
        done = self.trainer.fit_loop.epoch_loop.batch_progress.current.processed
        return {"batches": done, "loader": self.states[done]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.restored = state_dict


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(258, 16)
        self.head = torch.nn.Linear(16, 258)
        self.seen: list[int] = []  # the first token of each batch, to compare runs

    def training_step(self, batch: dict[str, Any], _: int) -> torch.Tensor:
        self.seen.append(int(batch["input_ids"][0, 0]))
        logits = self.head(self.emb(batch["input_ids"]))
        return torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch["labels"].flatten(), ignore_index=-100
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit(folder: Path, ckpt_path: str | None = None, max_steps: int = STEPS) -> list[int]:
    torch.manual_seed(0)
    model = TinyModel()
    saver = ModelCheckpoint(folder, every_n_train_steps=SAVE_EVERY, save_top_k=-1)
    trainer = L.Trainer(
        max_steps=max_steps,
        accelerator="cpu",
        callbacks=[saver],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=ZephonDataModule(), ckpt_path=ckpt_path)
    return model.seen


if __name__ == "__main__":
    warnings.filterwarnings("ignore", module="lightning")  # advice about workers and logging
    with tempfile.TemporaryDirectory() as tmp:
        whole = fit(Path(tmp) / "whole")
        head = fit(Path(tmp) / "cut", max_steps=SAVE_EVERY)  # a job that stops at its save
        (saved,) = (Path(tmp) / "cut").glob("*.ckpt")
        rest = fit(Path(tmp) / "resumed", ckpt_path=str(saved))
        assert head + rest == whole, (head, rest, whole)
        print(f"{len(whole)} steps; resumed from {saved.name} exactly")

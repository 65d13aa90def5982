"""Hugging Face ``transformers.Trainer`` on a Zephon pipeline, resumed exactly.

The Trainer takes a torch ``IterableDataset`` of samples and batches them itself. On resume it
would skip the batches already trained by reading them again; Zephon resumes instead: a
callback writes the pipeline's checkpoint into each Trainer checkpoint folder, and the resumed
run restores it and tells the Trainer not to skip (``ignore_data_skip=True``). The Trainer
reads a batch ahead of the step that uses it, so the dataset keeps its checkpoint after each
sample and the callback saves the one after the last sample a step trained on.

    python examples/recipes/hf_trainer.py
"""

from __future__ import annotations

import json
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import IterableDataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

BATCH, STEPS, SAVE_EVERY = 4, 16, 6


class Samples(IterableDataset[dict[str, torch.Tensor]]):
    """The pipeline's samples as tensors, with its checkpoint after each one."""

    def __init__(self, pipe: Pipeline, taken: int = 0) -> None:
        self.pipe, self.states, self.taken = pipe, {}, taken  # samples taken in all
        self.seen: list[int] = []

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        for row in self.pipe:
            self.taken += 1
            self.states[self.taken] = self.pipe.checkpoint()
            self.states.pop(self.taken - 16 * BATCH, None)  # the Trainer is a batch behind
            self.seen.append(int(row["input_ids"][0]))
            yield {k: torch.as_tensor(row[k]) for k in ("input_ids", "labels")}


class SaveZephon(TrainerCallback):
    """Writes the pipeline's checkpoint into each Trainer checkpoint folder."""

    def __init__(self, samples: Samples) -> None:
        self.samples = samples

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        done = state.global_step * BATCH * args.gradient_accumulation_steps
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        state_json = {"samples": done, "pipeline": self.samples.states[done]}
        (folder / "zephon.json").write_text(json.dumps(state_json))


def build() -> Pipeline:
    docs = [{"text": f"document {i} " * (1 + i % 5)} for i in range(400)]
    ds = Dataset.from_records("docs", docs, samples_per_shard=50)
    ws = StaticMixtureWorkSource([ds], seed=4, shuffle="global", stop_after_passes=None)
    return (
        Pipeline(ws, rank=0, world_size=1)
        .tokenize("bytes")
        .pack_sequences(32)
        .to_training(shift=False)  # Hugging Face models shift the labels themselves
    )


def train(out: Path, max_steps: int, resume: Path | None = None) -> list[int]:
    torch.manual_seed(0)
    pipe, taken = build(), 0
    if resume is not None:
        saved = json.loads((resume / "zephon.json").read_text())
        pipe.restore(saved["pipeline"])
        taken = saved["samples"]
    samples = Samples(pipe, taken)
    config = GPT2Config(vocab_size=258, n_positions=32, n_embd=32, n_layer=1, n_head=2)
    args = TrainingArguments(
        output_dir=str(out),
        max_steps=max_steps,
        per_device_train_batch_size=BATCH,
        save_steps=SAVE_EVERY,
        learning_rate=1e-3,
        report_to=[],
        use_cpu=True,
        ignore_data_skip=True,  # Zephon resumes the data itself
        disable_tqdm=True,
        logging_strategy="no",
    )
    trainer = Trainer(
        GPT2LMHeadModel(config), args, train_dataset=samples, callbacks=[SaveZephon(samples)]
    )
    trainer.train(resume_from_checkpoint=str(resume) if resume is not None else None)
    done = trainer.state.global_step - (int(resume.name.split("-")[1]) if resume else 0)
    return samples.seen[: done * BATCH]


if __name__ == "__main__":
    warnings.filterwarnings("ignore")  # the Trainer's advice on devices and saving
    with tempfile.TemporaryDirectory() as tmp:
        whole = train(Path(tmp) / "whole", STEPS)
        head = train(Path(tmp) / "cut", SAVE_EVERY)  # a job that stops at its save
        rest = train(Path(tmp) / "resumed", STEPS, Path(tmp) / "cut" / f"checkpoint-{SAVE_EVERY}")
        assert head + rest == whole, (head, rest, whole)
        print(f"{STEPS} steps of {BATCH} samples; resumed from checkpoint-{SAVE_EVERY} exactly")

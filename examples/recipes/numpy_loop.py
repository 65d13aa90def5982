"""A plain training loop with NumPy (as a JAX loop would be): batches as arrays, the
loader's state saved beside the parameters, and an exact resume.

The model is a bigram table trained by plain gradient steps on packed rows of byte tokens;
what matters here is the loop's shape: ``for batch in pipe`` gives NumPy arrays, the
checkpoint is ``{"params": ..., "data": pipe.checkpoint()}`` in one JSON file, and a new
process restores both and goes on exactly (the losses of a resumed run equal those of an
uninterrupted one, bit for bit).

    python examples/recipes/numpy_loop.py
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

VOCAB, SEQ = 258, 64
WORDS = [
    "stream",
    "shard",
    "range",
    "token",
    "batch",
    "lane",
    "mixture",
    "curriculum",
    "the",
    "of",
    "a",
]


def build() -> Pipeline:
    rng = np.random.default_rng(0)
    docs = [{"text": " ".join(rng.choice(WORDS, int(rng.integers(5, 40))))} for _ in range(600)]
    ds = Dataset.from_records("docs", docs, samples_per_shard=100)
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="global")
    return (
        Pipeline(ws, rank=0, world_size=1)
        .tokenize("bytes")
        .pack_sequences(SEQ)
        .batch(4)
        .to_training()
    )


def step(params: np.ndarray, batch: dict[str, Any], lr: float = 0.5) -> tuple[np.ndarray, float]:
    """One gradient step of a bigram softmax model; returns the new table and the loss."""
    ids, labels = batch["input_ids"].reshape(-1), batch["labels"].reshape(-1)
    keep = labels >= 0
    ids, labels = ids[keep], labels[keep]
    logits = params[ids]
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(axis=1, keepdims=True)
    loss = float(-np.log(probs[np.arange(len(ids)), labels]).mean())
    grad = probs
    grad[np.arange(len(ids)), labels] -= 1
    update = np.zeros_like(params)
    np.add.at(update, ids, grad / len(ids))
    return params - lr * update, loss


def train(steps: int, save_at: int | None, path: Path, resume: bool = False) -> list[float]:
    params, done, pipe = np.zeros((VOCAB, VOCAB)), 0, build()
    if resume:
        saved = json.loads(path.read_text())
        params, done = np.array(saved["params"]), saved["step"]
        pipe.restore(saved["data"])
    losses: list[float] = []
    for batch in pipe:
        params, loss = step(params, batch)
        losses.append(loss)
        done += 1
        if done == save_at:
            state = {"step": done, "params": params.tolist(), "data": pipe.checkpoint()}
            path.write_text(json.dumps(state))  # the job may be killed from here on
            break
        if done == steps:
            break
    return losses


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "checkpoint.json"
        whole = train(40, None, path)
        first = train(40, 15, path)
        rest = train(40, None, path, resume=True)
        assert first + rest == whole, "the resumed run differs"
        print(f"{len(whole)} steps, loss {whole[0]:.3f} -> {whole[-1]:.3f}; resumed exactly")

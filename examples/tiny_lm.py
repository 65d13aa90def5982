"""The 2-layer model and the train / checkpoint / resume loop the examples share.

A run trains ``steps`` steps on a pipeline's batches (``input_ids``, ``position_ids``,
``cu_seqlens``, ``labels`` from ``to_training()``); with ``stop_at`` it stops there and
returns what a job saves (the pipeline's JSON state with the model and optimizer); with
``resume`` it continues from such a save. Attention is causal within each packed document
(a block-diagonal mask: what FlashAttention's varlen kernel computes).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import torch

from zephon import Pipeline

SEQ, DIM = 128, 32


class TinyLM(torch.nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, DIM), torch.nn.Embedding(SEQ, DIM)
        layer = torch.nn.TransformerEncoderLayer(DIM, 2, 64, dropout=0.0, batch_first=True)
        self.layers = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(DIM, vocab)

    def forward(
        self, ids: torch.Tensor, pos: torch.Tensor, cu_seqlens: torch.Tensor
    ) -> torch.Tensor:
        # Varlen attention emulated: tokens attend causally within their own document only.
        flat = ids.numel()
        doc = torch.bucketize(torch.arange(flat), cu_seqlens[1:], right=True)
        allowed = (doc[:, None] == doc[None, :]) & torch.ones(flat, flat, dtype=torch.bool).tril()
        x = (self.emb(ids) + self.pos(pos)).reshape(1, flat, DIM)
        x = self.layers(x, mask=~allowed)
        return self.head(x).reshape(*ids.shape, -1)


def train(
    build: Callable[[], Pipeline],
    vocab: int,
    steps: int,
    stop_at: int | None = None,
    resume: dict[str, Any] | None = None,
) -> tuple[list[float], dict[str, Any] | None]:
    torch.manual_seed(0)
    # One thread: a bitwise comparison of losses needs kernels that sum in a fixed order,
    # and a multi-threaded BLAS may split its sums by how busy the machine is (the losses
    # after a resume once differed in the seventh digit while the test suite ran beside it).
    torch.set_num_threads(1)
    model = TinyLM(vocab)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pipe, step = build(), 0
    if resume is not None:
        pipe.restore(resume["data"])
        model.load_state_dict(resume["model"])
        opt.load_state_dict(resume["opt"])
        step = resume["step"]
    losses = []
    for batch in pipe:
        logits = model(batch["input_ids"], batch["position_ids"], batch["cu_seqlens"])
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), batch["labels"].reshape(-1), ignore_index=-100
        )
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        step += 1
        if step == stop_at:  # what a job saves: the data state with the weights
            return losses, {
                "data": pipe.checkpoint(),
                "model": model.state_dict(),
                "opt": opt.state_dict(),
                "step": step,
            }
        if step == steps:
            break
    return losses, None


def train_and_resume(build: Callable[[], Pipeline], vocab: int, steps: int) -> None:
    """Train ``steps`` steps straight, then half, checkpoint (through JSON), resume in a fresh
    pipeline and model for the rest: the losses must be the same, bit for bit."""
    whole, _ = train(build, vocab, steps)
    head, saved = train(build, vocab, steps, stop_at=steps // 2)
    assert saved is not None
    saved["data"] = json.loads(json.dumps(saved["data"]))  # checkpoints are JSON
    tail, _ = train(build, vocab, steps, resume=saved)
    print("losses:", " ".join(f"{x:.4f}" for x in whole))
    assert head + tail == whole, (head + tail, whole)
    print(
        f"resumed exactly: {len(head)} steps, checkpoint, {len(tail)} more == {len(whole)} straight"
    )

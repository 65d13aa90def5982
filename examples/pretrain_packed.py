"""Packed pretraining: two datasets mixed 70/30, tokenized, packed with ``concat`` into rows of
128 tokens, batched, then ``to_training()`` (labels that never cross documents, restarting
``position_ids``, ``cu_seqlens`` for variable-length attention). A 2-layer torch model trains on
the batches with a block-diagonal causal mask (what FlashAttention's varlen kernel computes);
the run is checkpointed mid-way (pipeline state with the model and optimizer), resumed in a
fresh pipeline and model, and must end bitwise where an uninterrupted run ends.

    .venv/bin/python examples/pretrain_packed.py [--steps 8]
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

SEQ, BATCH, DIM = 128, 4, 32


def write_data(root: Path) -> Tokenizer:
    rng = random.Random(0)
    words = {
        "web": ["the", "data", "loader", "streams", "shards", "quickly", "from", "storage"],
        "code": ["def", "return", "self", "import", "class", "lambda", "yield", "async"],
    }
    for name, vocab in words.items():
        (root / name).mkdir()
        for s in range(3):
            docs = [
                {"text": " ".join(rng.choices(vocab, k=rng.randrange(10, 90)))} for _ in range(60)
            ]
            (root / name / f"part-{s}.jsonl").write_text("\n".join(map(json.dumps, docs)) + "\n")
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        [" ".join(v) for v in words.values()] * 50,
        trainers.BpeTrainer(vocab_size=120, special_tokens=["[UNK]", "</s>"]),
    )
    return tok


def pipeline(root: Path, tok: Tokenizer) -> Pipeline:
    web, code = (
        Dataset.from_path("web", str(root / "web")),
        Dataset.from_path("code", str(root / "code")),
    )
    ws = StaticMixtureWorkSource(
        [web, code], {"web": 0.7, "code": 0.3}, seed=7, shuffle="global", stop_after_passes=None
    )
    return (
        Pipeline(ws, rank=0, world_size=1, lanes=2)
        .tokenize(tok, bos=False, eos=True)
        .pack_sequences(SEQ, "concat")
        .batch(BATCH)
        .to_training()
        .to_torch()
    )


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
    root: Path,
    tok: Tokenizer,
    steps: int,
    stop_at: int | None = None,
    resume: dict[str, Any] | None = None,
) -> tuple[list[float], dict[str, Any] | None]:
    torch.manual_seed(0)
    model = TinyLM(tok.get_vocab_size())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    pipe, step = pipeline(root, tok), 0
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    steps = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = write_data(root)
        whole, _ = train(root, tok, steps)
        head, saved = train(root, tok, steps, stop_at=steps // 2)
        assert saved is not None
        saved["data"] = json.loads(json.dumps(saved["data"]))  # checkpoints are JSON
        tail, _ = train(root, tok, steps, resume=saved)
    print("losses:", " ".join(f"{x:.4f}" for x in whole))
    assert head + tail == whole, (head + tail, whole)
    print(
        f"resumed exactly: {len(head)} steps, checkpoint, {len(tail)} more == {len(whole)} straight"
    )


if __name__ == "__main__":
    main()

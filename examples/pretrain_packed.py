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
import functools
import json
import random
import tempfile
from pathlib import Path

from tiny_lm import SEQ, train_and_resume
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

BATCH = 4


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=8)
    steps = parser.parse_args().steps
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        tok = write_data(root)
        train_and_resume(functools.partial(pipeline, root, tok), tok.get_vocab_size(), steps)


if __name__ == "__main__":
    main()

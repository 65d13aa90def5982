"""tokenize + pack throughput vs the tokenizer's own ``encode_batch``, and checkpoint cost.

1. Tokens/s: a small BPE (trained here, offline) encodes the same texts through
   ``Tokenizer.encode_batch`` in batches of 1,024, and through a Zephon pipeline
   (in-memory dataset -> tokenize -> pack(2048, concat)); alternating rounds, medians.
2. Checkpoint after 1,000,000 delivered samples (8 lanes, shuffle + batch): its JSON size,
   and the time from ``restore`` to the first item of the resumed run.

    .venv/bin/python benchmarks/tokenize_pack.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

WORDS = [
    "data", "loader", "stream", "shard", "token", "batch", "range", "object", "store", "model",
    "train", "gradient", "lane", "mixture", "curriculum", "the", "of", "and", "to", "in",
]  # fmt: skip


def texts(n: int) -> list[str]:
    rng = random.Random(0)
    return [" ".join(rng.choices(WORDS, k=rng.randrange(20, 200))) for _ in range(n)]


def bpe(sample: list[str]) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(sample, trainers.BpeTrainer(vocab_size=500, special_tokens=["[UNK]"]))
    return tok


def direct(tok: Tokenizer, docs: list[str]) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(0, len(docs), 1024):
        total += sum(len(e.ids) for e in tok.encode_batch(docs[i : i + 1024]))
    return total / (time.perf_counter() - started)


def zephon(tok: Tokenizer, ds: Dataset) -> float:
    ws = StaticMixtureWorkSource([ds], shuffle="none")
    pipe = Pipeline(ws, rank=0, world_size=1).tokenize(tok, bos=False, eos=False).pack(2048)

    async def run() -> int:
        tokens = 0
        async for row in pipe:
            tokens += int((row["segment_ids"] > 0).sum())
        return tokens

    started = time.perf_counter()
    total = asyncio.run(run())
    return total / (time.perf_counter() - started)


def checkpoint_cost(n: int) -> None:
    ds = Dataset.from_records("big", ({"id": i} for i in range(n)), samples_per_shard=50_000)
    ws = StaticMixtureWorkSource([ds], shuffle="block", stop_after_passes=None)

    def build() -> Pipeline:
        return Pipeline(ws, rank=0, world_size=1, lanes=8).shuffle(4096).batch(64)

    pipe = build()
    it = iter(pipe)
    seen = 0
    for batch in it:
        seen += len(batch["id"])
        if seen >= 1_000_000:
            break
    state = pipe.checkpoint()
    it.close()
    blob = json.dumps(state)
    started = time.perf_counter()
    again = build()
    again.restore(json.loads(blob))
    it = iter(again)
    next(it)
    restore_s = time.perf_counter() - started
    it.close()
    print(f"\n# 2. checkpoint after {seen:,} samples (8 lanes, shuffle(4096), batch(64))")
    print(f"size {len(blob):,} bytes of JSON (target < 16,384); restore to first batch "
          f"{restore_s:.3f} s (target < 1 s)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    docs = texts(args.docs)
    tok = bpe(docs[:5000])
    ds = Dataset.from_records("docs", [{"text": t} for t in docs], samples_per_shard=5000)
    a, b = [], []
    for r in range(args.rounds):
        if r % 2:
            b.append(zephon(tok, ds))
            a.append(direct(tok, docs))
        else:
            a.append(direct(tok, docs))
            b.append(zephon(tok, ds))
    da, zb = statistics.median(a), statistics.median(b)
    print(f"# 1. tokenize + pack(2048) of {args.docs:,} documents, median of {args.rounds}")
    print(f"encode_batch           {da:>12,.0f} tokens/s")
    print(f"zephon tokenize+pack   {zb:>12,.0f} tokens/s")
    print(f"ratio                  {zb / da:>12.2f}x (target >= 0.8x)")
    checkpoint_cost(1_200_000)


if __name__ == "__main__":
    main()

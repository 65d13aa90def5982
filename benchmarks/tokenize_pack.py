"""tokenize + pack throughput vs the tokenizer's own ``encode_batch``, and checkpoint cost.

1. Tokens/s: a byte-level BPE of 32,000 tokens (``--vocab``; trained here, offline, on
   documents drawn with Zipf's law from 60,000 pseudo-words) encodes the same texts through
   ``Tokenizer.encode_batch`` in batches of 1,024, and through a Zephon pipeline (in-memory
   dataset -> tokenize -> pack(2048, concat)); alternating rounds, medians; tokens/s and
   tokens per CPU second (the process's CPU time: the tokenizer's threads included).
2. Checkpoint after 1,000,000 delivered samples (8 lanes, shuffle + batch): its JSON size,
   and the time from ``restore`` to the first item of the resumed run.
3. Chat SFT: ``tokenize_chat`` + ``pack_sequences(best_fit)`` + ``to_training`` against a
   hand-written loop calling the same tokenizer and template (render, encode in batches,
   mask the assistant spans, best-fit into rows, shifted labels); trained tokens/s.
4. Packing quality per algorithm over the same conversations: padding fraction of the rows
   and documents split across rows.

    .venv/bin/python benchmarks/tokenize_pack.py
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import time

from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

WORDS = [
    "data", "loader", "stream", "shard", "token", "batch", "range", "object", "store", "model",
    "train", "gradient", "lane", "mixture", "curriculum", "the", "of", "and", "to", "in",
]  # fmt: skip


def lexicon(size: int = 60_000) -> list[str]:
    """Pseudo-words of 1-4 syllables: a vocabulary as large as a language's, so that a BPE
    of 32,000 merges learns real-size tokens."""
    rng = random.Random(1)
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    words = {"".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(size * 2)}
    return [*WORDS, *sorted(words)[:size]]


def texts(n: int) -> list[str]:
    """Documents of 20-200 words drawn with Zipf's law over :func:`lexicon`."""
    rng = random.Random(0)
    words = lexicon()
    weights = [1 / (rank + 1) for rank in range(len(words))]
    return [" ".join(rng.choices(words, weights, k=rng.randrange(20, 200))) for _ in range(n)]


def bpe(sample: list[str], vocab_size: int = 32_000) -> Tokenizer:
    """A byte-level BPE (GPT-2's pre-tokenizer) of ``vocab_size`` tokens trained here."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(sample, trainer)
    return tok


def direct(tok: Tokenizer, docs: list[str]) -> tuple[float, float]:
    """(tokens/s, tokens per CPU second) of ``encode_batch`` over blocks of 1,024."""
    started, cpu = time.perf_counter(), time.process_time()
    total = 0
    for i in range(0, len(docs), 1024):
        total += sum(len(e.ids) for e in tok.encode_batch(docs[i : i + 1024]))
    return total / (time.perf_counter() - started), total / (time.process_time() - cpu)


def zephon(tok: Tokenizer, ds: Dataset) -> tuple[float, float]:
    ws = StaticMixtureWorkSource([ds], shuffle="none")
    pipe = Pipeline(ws, rank=0, world_size=1).tokenize(tok, bos=False, eos=False).pack(2048)

    async def run() -> int:
        tokens = 0
        async for row in pipe:
            tokens += int((row["segment_ids"] > 0).sum())
        return tokens

    started, cpu = time.perf_counter(), time.process_time()
    total = asyncio.run(run())
    return total / (time.perf_counter() - started), total / (time.process_time() - cpu)


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
    print(
        f"size {len(blob):,} bytes of JSON (target < 16,384); restore to first batch "
        f"{restore_s:.3f} s (target < 1 s)"
    )


CHATML = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\\n' }}{% generation %}{{ message['content'] + '<|im_end|>' }}"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endif %}{% endfor %}"
)


def conversations(n: int) -> list[dict[str, object]]:
    rng = random.Random(1)
    out = []
    for _ in range(n):
        turns = []
        for _ in range(rng.randrange(1, 4)):
            turns.append(
                {"role": "user", "content": " ".join(rng.choices(WORDS, k=rng.randrange(5, 60)))}
            )
            turns.append(
                {
                    "role": "assistant",
                    "content": " ".join(rng.choices(WORDS, k=rng.randrange(10, 300))),
                }
            )
        out.append({"messages": turns})
    return out


def chat_bpe(convs: list[dict[str, object]]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    text = [m["content"] for c in convs[:2000] for m in c["messages"]]  # type: ignore[attr-defined]
    tok.train_from_iterator(
        text,
        trainers.BpeTrainer(
            vocab_size=600,
            special_tokens=["<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return tok


def sft_zephon(
    tok: Tokenizer, ds: Dataset, seq: int, algorithm: str = "best_fit"
) -> tuple[float, list]:
    ws = StaticMixtureWorkSource([ds], shuffle="none")
    pipe = (
        Pipeline(ws, rank=0, world_size=1)
        .tokenize_chat(tok, chat_template=CHATML)
        .pack_sequences(seq, algorithm, window=256)
        .to_training()
    )
    started = time.perf_counter()
    rows = list(pipe)
    elapsed = time.perf_counter() - started
    return sum(int((r["segment_ids"] > 0).sum()) for r in rows) / elapsed, rows


def sft_by_hand(tok: Tokenizer, convs: list[dict[str, object]], seq: int) -> float:
    """What a user would write around the same template and tokenizer."""
    import numpy as np

    from zephon.ops.chat import _compile

    opens, closes = "\ue000", "\ue001"  # where the template's generation spans begin and end
    template = _compile(CHATML, (opens, closes))  # the same sandboxed template
    started = time.perf_counter()
    tokens = 0
    for i in range(0, len(convs), 256):  # a window of conversations at a time
        texts, spans = [], []
        for c in convs[i : i + 256]:
            marked = template.render(messages=c["messages"])
            text, found, at = [], [], 0
            for k, piece in enumerate(marked.split(opens)):
                if k:
                    inside, _, piece = piece.partition(closes)
                    found.append((at, at + len(inside)))
                    text.append(inside)
                    at += len(inside)
                text.append(piece)
                at += len(piece)
            texts.append("".join(text))
            spans.append(found)
        docs = []
        for enc, found in zip(
            tok.encode_batch(texts, add_special_tokens=False), spans, strict=True
        ):
            starts = np.array([o[0] for o in enc.offsets])
            mask = np.zeros(len(enc.ids), np.int8)
            for a, b in found:
                mask[(starts >= a) & (starts < b)] = 1
            ids = np.array(enc.ids, np.int32)
            for s in range(0, len(ids), seq):
                docs.append((ids[s : s + seq], mask[s : s + seq]))
        rows: list[list] = []
        room: list[int] = []
        for ids, mask in docs:  # best fit
            fits = [r for r in range(len(rows)) if room[r] >= len(ids)]
            if fits:
                r = min(fits, key=lambda x: room[x])
            else:
                rows.append([])
                room.append(seq)
                r = len(rows) - 1
            rows[r].append((ids, mask))
            room[r] -= len(ids)
        for row in rows:
            ids = np.zeros(seq, np.int64)
            mask = np.zeros(seq, np.int8)
            seg = np.zeros(seq, np.int32)
            at = 0
            for k, (d, m) in enumerate(row, start=1):
                ids[at : at + len(d)], mask[at : at + len(d)], seg[at : at + len(d)] = d, m, k
                at += len(d)
            labels = np.full(seq, -100, np.int64)
            keep = (seg[1:] == seg[:-1]) & (mask[1:] == 1) & (seg[1:] > 0)
            labels[:-1][keep] = ids[1:][keep]
            tokens += at
    return tokens / (time.perf_counter() - started)


def sft(rounds: int, n: int = 4000, seq: int = 2048) -> None:
    convs = conversations(n)
    tok = chat_bpe(convs)
    ds = Dataset.from_records("chat", convs, samples_per_shard=1000)
    hand, ours = [], []
    for _ in range(rounds):
        hand.append(sft_by_hand(tok, convs, seq))
        ours.append(sft_zephon(tok, ds, seq)[0])
    h, z = statistics.median(hand), statistics.median(ours)
    print(
        f"\n# 3. chat SFT: tokenize_chat + pack_sequences({seq}, best_fit) + to_training, "
        f"{n:,} conversations, median of {rounds}"
    )
    print(f"hand-written loop      {h:>12,.0f} tokens/s")
    print(f"zephon                 {z:>12,.0f} tokens/s")
    print(f"ratio                  {z / h:>12.2f}x (target >= 0.8x)")
    print(f"\n# 4. packing quality, the same conversations, rows of {seq // 4}, windows of 256")
    print(f"{'algorithm':<15} {'rows':>7} {'padding':>8} {'documents split':>16}")
    for algorithm in ("concat", "first_fit", "best_fit", "best_fit_wrap"):
        _, rows = sft_zephon(tok, ds, seq // 4, algorithm)
        cells = len(rows) * (seq // 4)
        used = sum(int((r["segment_ids"] > 0).sum()) for r in rows)
        pieces = sum(int(r["segment_ids"].max()) for r in rows)
        print(f"{algorithm:<15} {len(rows):>7,} {1 - used / cells:>8.1%} {pieces - n:>16,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=32_000, help="BPE vocabulary size")
    args = parser.parse_args()
    docs = texts(args.docs)
    started = time.perf_counter()
    tok = bpe(docs[:20_000], args.vocab)
    trained = time.perf_counter() - started
    ds = Dataset.from_records("docs", [{"text": t} for t in docs], samples_per_shard=5000)
    a: list[tuple[float, float]] = []
    b: list[tuple[float, float]] = []
    for r in range(args.rounds):
        if r % 2:
            b.append(zephon(tok, ds))
            a.append(direct(tok, docs))
        else:
            a.append(direct(tok, docs))
            b.append(zephon(tok, ds))
    da, zb = statistics.median(x[0] for x in a), statistics.median(x[0] for x in b)
    dc, zc = statistics.median(x[1] for x in a), statistics.median(x[1] for x in b)
    print(
        f"# 1. tokenize + pack(2048) of {args.docs:,} documents, byte-level BPE of "
        f"{tok.get_vocab_size():,} tokens (trained here in {trained:.0f} s), median of "
        f"{args.rounds}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}"
    )
    print(f"{'':<22} {'tokens/s':>12} {'tokens per CPU s':>17}")
    print(f"{'encode_batch':<22} {da:>12,.0f} {dc:>17,.0f}")
    print(f"{'zephon tokenize+pack':<22} {zb:>12,.0f} {zc:>17,.0f}")
    print(f"{'ratio':<22} {zb / da:>11.2f}x {zc / dc:>16.2f}x   (target >= 1.0x)")
    checkpoint_cost(1_200_000)
    sft(args.rounds)


if __name__ == "__main__":
    main()

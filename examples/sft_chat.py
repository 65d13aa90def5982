"""Chat SFT: conversations rendered with a ChatML template (``tokenize_chat``), the loss on
assistant tokens only (``loss_mask``, found by verified prefix-diff), packed with
``best_fit`` into rows of 128 tokens with the mask carried along (``pack_sequences``), batched,
then ``to_training()`` (labels -100 off the assistant turns and across documents). A 2-layer
torch model trains with a block-diagonal causal mask; the run is checkpointed mid-way,
resumed in a fresh pipeline and model, and must end bitwise where an uninterrupted run ends.

    .venv/bin/python examples/sft_chat.py [--steps 8]
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


CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def write_data(root: Path) -> Tokenizer:
    rng = random.Random(0)
    words = ["how", "do", "I", "stream", "shards", "you", "use", "ranges", "and", "asyncio"]
    (root / "chat").mkdir()
    for s in range(3):
        convs = []
        for _ in range(40):
            turns = []
            for _ in range(rng.randrange(1, 3)):
                turns.append({"role": "user", "content": " ".join(rng.choices(words, k=6))})
                turns.append(
                    {
                        "role": "assistant",
                        "content": " ".join(rng.choices(words, k=rng.randrange(4, 30))),
                    }
                )
            convs.append({"messages": turns})
        (root / "chat" / f"part-{s}.jsonl").write_text("\n".join(map(json.dumps, convs)) + "\n")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        [" ".join(words)] * 50,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|im_start|>", "<|im_end|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    return tok


def pipeline(root: Path, tok: Tokenizer) -> Pipeline:
    ws = StaticMixtureWorkSource(
        [Dataset.from_path("chat", str(root / "chat"))],
        seed=7,
        shuffle="global",
        stop_after_passes=None,
    )
    return (
        Pipeline(ws, rank=0, world_size=1, lanes=2)
        .tokenize_chat(tok, chat_template=CHATML, max_length=SEQ)
        .pack_sequences(SEQ, "best_fit", window=64)
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

"""Train-loop shaped example over local JSONL files: mix, tokenize, pack, batch, checkpoint.

.venv/bin/python examples/local_jsonl.py
"""

from __future__ import annotations

import json
import random
import tempfile
from pathlib import Path

from zephon import Dataset, Pipeline, StaticMixtureWorkSource


def write(root: Path, name: str, shards: int, docs: int) -> None:
    rng = random.Random(name)
    (root / name).mkdir(parents=True)
    for s in range(shards):
        lines = [
            json.dumps({"text": " ".join(rng.choices(["data", "loader", name], k=40))})
            for _ in range(docs)
        ]
        (root / name / f"part-{s:03d}.jsonl").write_text("\n".join(lines) + "\n")


def build(root: Path) -> Pipeline:
    web = Dataset.from_path("web", str(root / "web"))
    code = Dataset.from_path("code", str(root / "code"))
    ws = StaticMixtureWorkSource([web, code], {"web": 0.7, "code": 0.3}, seed=0)
    return (
        Pipeline(ws, rank=0, world_size=1, lanes=2)
        .tokenize("bytes")
        .shuffle(1024)
        .pack(512)
        .batch(8, drop_last=True)
    )


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        write(root, "web", shards=4, docs=500)
        write(root, "code", shards=2, docs=400)
        pipe = build(root)
        shapes = []
        for step, batch in enumerate(pipe, start=1):
            shapes.append(tuple(batch["input_ids"].shape))  # a training step would go here
            if step == 5:
                state = pipe.checkpoint()  # what a training job would save with its weights
                break
        print(f"5 steps of {shapes[-1]}; checkpoint is {len(json.dumps(state))} bytes")
        resumed = build(root)
        resumed.restore(state)
        rest = sum(1 for _ in resumed)
        print(f"resumed and finished the pass: {rest} more steps")


if __name__ == "__main__":
    main()

"""The examples run as users run them (a fresh interpreter, warnings as errors) and check
themselves: training a few steps of a 2-layer model and resuming exactly mid-run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize(
    ("script", "says"),
    [
        ("pretrain_packed.py", "resumed exactly"),
        ("sft_chat.py", "resumed exactly"),
        ("local_jsonl.py", "checkpoint is"),
        ("image_text_pairs.py", "resumed exactly"),
        ("recipes/numpy_loop.py", "resumed exactly"),
        ("recipes/torchtitan_dataloader.py", "resumed exactly"),
        ("recipes/lightning_datamodule.py", "exactly"),
        ("recipes/hf_trainer.py", "exactly"),
    ],
)
def test_example_runs(script: str, says: str) -> None:
    pytest.importorskip("torch")
    # torchdata's StatefulDataLoader calls a torch function torch 2.13 deprecates
    quiet = ["-W", "error", "-W", "ignore:'set_vital' is deprecated"]
    done = subprocess.run(
        [sys.executable, *quiet, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert says in done.stdout

"""``tokenize()``'s special tokens follow the tokenizer: a GPT-2 style tokenizer.json (only
``<|endoftext|>``) gets no BOS and an EOS by default, so the README's example runs with it;
``bos=True`` still requires one and says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon import ConfigError, Dataset, Pipeline, StaticMixtureWorkSource

tokenizers = pytest.importorskip("tokenizers")


def gpt2_style(path: Path) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from tokenizers.trainers import BpeTrainer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    trainer = BpeTrainer(special_tokens=["<|endoftext|>"], vocab_size=300)
    tok.train_from_iterator(["hello world, a tokenizer of one special token"] * 20, trainer)
    tok.save(str(path))
    return str(path)


def test_a_gpt2_style_tokenizer_gets_eos_only_by_default(tmp_path: Path) -> None:
    path = gpt2_style(tmp_path / "tokenizer.json")
    eot = tokenizers.Tokenizer.from_file(path).token_to_id("<|endoftext|>")
    ds = Dataset.from_records("t", [{"text": "hello world"} for _ in range(40)])
    ws = StaticMixtureWorkSource([ds])
    rows = list(Pipeline(ws).tokenize(path))
    assert all(r["input_ids"][-1] == eot and r["input_ids"][0] != eot for r in rows)
    # the README's chain runs as printed with it
    batches = list(Pipeline(ws).tokenize(path).pack_sequences(16).batch(2).to_training())
    assert batches and batches[0]["input_ids"].shape == (2, 16)
    with pytest.raises(ConfigError, match="bos=True but the tokenizer has none of"):
        Pipeline(ws).tokenize(path, bos=True)
    with pytest.raises(ConfigError, match="bos must be 'auto', True, False or a token id"):
        Pipeline(ws).tokenize(path, bos="yes")  # type: ignore[arg-type]


def test_bytes_and_explicit_ids_are_as_before() -> None:
    ds = Dataset.from_records("t", [{"text": "ab"}])
    (row,) = list(Pipeline(StaticMixtureWorkSource([ds])).tokenize("bytes"))
    assert row["input_ids"].tolist() == [256, 97, 98, 257]
    (row,) = list(Pipeline(StaticMixtureWorkSource([ds])).tokenize("bytes", bos=7, eos=False))
    assert row["input_ids"].tolist() == [7, 97, 98]

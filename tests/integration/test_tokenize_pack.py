"""tokenize, shuffle and pack: what they produce, checked against the definitions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from zephon import Dataset
from zephon.errors import ConfigError
from zephon.pipeline import Pipeline
from zephon.plan import StaticMixtureWorkSource

pytestmark = pytest.mark.integration

TEXTS = [("lorem ipsum dolor sit amet " * (1 + i % 13)).strip() + f" #{i}" for i in range(600)]


@pytest.fixture(scope="module")
def docs() -> Dataset:
    return Dataset.from_records(
        "docs", [{"id": i, "text": t} for i, t in enumerate(TEXTS)], samples_per_shard=64
    )


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small BPE trained offline with the tokenizers library (no hub downloads)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=200, special_tokens=["[UNK]", "<s>", "</s>"])
    tok.train_from_iterator(TEXTS, trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    tok.save(str(path))
    return path


def pipe(ds: Dataset, **kw: Any) -> Pipeline:
    ws = StaticMixtureWorkSource([ds], seed=1, shuffle="none", chunk_size=100, **kw)
    return Pipeline(ws, rank=0, world_size=1, lanes=1)


def test_tokenize_matches_encode_batch_for_every_tokenizer_kind(docs: Dataset, bpe: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bpe))
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    expected = [[bos, *e.ids, eos] for e in tok.encode_batch(TEXTS, add_special_tokens=False)]
    for given in (tok, str(bpe)):
        out = list(pipe(docs).tokenize(given))
        assert [s["input_ids"].tolist() for s in out] == expected
    in_pool = list(pipe(docs).tokenize(tok, processes=2))
    assert [s["input_ids"].tolist() for s in in_pool] == expected
    raw = list(pipe(docs).tokenize("bytes", bos=False, eos=False, max_length=5))
    assert [s["input_ids"].tolist() for s in raw] == [list(t.encode())[:5] for t in TEXTS]
    with pytest.raises(ConfigError, match="unsupported tokenizer"):
        pipe(docs).tokenize(object())


def test_concat_packing_loses_no_tokens(docs: Dataset) -> None:
    seq = 64
    ids = [s["input_ids"].tolist() for s in pipe(docs).tokenize("bytes")]
    rows = list(pipe(docs).tokenize("bytes").pack(seq, "concat"))
    assert all(len(r["input_ids"]) == seq for r in rows)
    flat = [
        t
        for r in rows
        for t, g in zip(r["input_ids"].tolist(), r["segment_ids"].tolist(), strict=True)
        if g
    ]
    assert flat == [t for doc in ids for t in doc]  # every token, in order
    for r in rows:  # positions restart at each document and count up within it
        seg, pos = r["segment_ids"], r["positions"]
        for g in set(seg.tolist()) - {0}:
            p = pos[seg == g]
            assert (np.diff(p) == 1).all()


def test_transformers_tokenizers_are_accepted(docs: Dataset, bpe: Path) -> None:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer.from_file(str(bpe))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    bos, eos = tok.token_to_id("<s>"), tok.token_to_id("</s>")
    expected = [[bos, *e.ids, eos] for e in tok.encode_batch(TEXTS, add_special_tokens=False)]
    out = list(pipe(docs).tokenize(hf))
    assert [s["input_ids"].tolist() for s in out] == expected


def test_tiktoken_encodings_are_accepted(docs: Dataset) -> None:
    import tiktoken

    # Built offline: byte-level ranks plus a few merges, and two special tokens.
    ranks = {bytes([i]): i for i in range(256)}
    for word in (b"lo", b"lorem", b"ip", b"ipsum"):
        for k in range(2, len(word) + 1):
            ranks.setdefault(word[:k], len(ranks))
    enc = tiktoken.Encoding(
        "zephon-test",
        pat_str=r"\S+|\s+",
        mergeable_ranks=ranks,
        special_tokens={"<|startoftext|>": 1000, "<|endoftext|>": 1001},
    )
    expected = [[1000, *ids, 1001] for ids in enc.encode_ordinary_batch(TEXTS)]
    assert any(len(e) < len(t) + 2 for e, t in zip(expected, TEXTS, strict=True))  # merged
    out = list(pipe(docs).tokenize(enc))
    assert [s["input_ids"].tolist() for s in out] == expected


@pytest.mark.parametrize("algorithm", ["first_fit", "best_fit"])
def test_fit_packing_never_splits_short_documents(docs: Dataset, algorithm: str) -> None:
    seq = 96
    ids = [tuple(s["input_ids"].tolist()) for s in pipe(docs).tokenize("bytes")]
    rows = list(pipe(docs).tokenize("bytes").pack(seq, algorithm, pad_id=-1, window=50))
    pieces = []
    for r in rows:
        assert len(r["input_ids"]) == seq
        seg = r["segment_ids"]
        assert (r["input_ids"][seg == 0] == -1).all()  # padding is pad_id
        for g in sorted(set(seg.tolist()) - {0}):
            pieces.append(tuple(r["input_ids"][seg == g].tolist()))
    short = Counter(d for d in ids if len(d) <= seq)
    assert all(short[d] <= Counter(pieces)[d] for d in short)  # each short doc whole
    assert sum(map(len, pieces)) == sum(map(len, ids))  # and nothing lost
    if algorithm == "best_fit":
        first = list(pipe(docs).tokenize("bytes").pack(seq, "first_fit", window=50))
        assert len(rows) <= len(first) + 1


def test_shuffle_is_a_deterministic_permutation(docs: Dataset) -> None:
    plain = [s["id"] for s in pipe(docs)]
    a = [s["id"] for s in pipe(docs).shuffle(128)]
    b = [s["id"] for s in pipe(docs).shuffle(128)]
    c = [s["id"] for s in pipe(docs).shuffle(128, seed=99)]
    assert a == b and a != plain and a != c
    assert sorted(a) == sorted(plain)
    for w in range(0, 600, 128):  # a window permutes exactly its own items
        assert sorted(a[w : w + 128]) == sorted(plain[w : w + 128])


_MIXED: list[Dataset] = []


def _mixture(lanes: int = 1) -> Pipeline:
    if not _MIXED:  # built once: in-memory datasets are distinct objects each time
        _MIXED.append(
            Dataset.from_records(
                "short", [{"id": i, "text": f"s{i}"} for i in range(3000)], samples_per_shard=300
            )
        )
        _MIXED.append(
            Dataset.from_records(
                "long",
                [{"id": 10**6 + i, "text": "word " * (40 + i % 80)} for i in range(400)],
                samples_per_shard=50,
            )
        )
    ws = StaticMixtureWorkSource(
        _MIXED, {"short": 1, "long": 1}, seed=3, mixture_unit="tokens", chunk_size=64
    )
    return Pipeline(ws, rank=0, world_size=1, lanes=lanes).tokenize("bytes")


def test_token_mixture_measures_tokens_per_byte_with_the_pipeline_tokenizer() -> None:
    p = _mixture()
    assert p.source.uncalibrated() == ["short", "long"]
    tokens: Counter[str] = Counter()
    it = iter(p)
    for _ in range(1500):
        s = next(it)
        tokens["long" if s["id"] >= 10**6 else "short"] += len(s["input_ids"])
    it.close()
    ratios = dict(zip(p.source.names, p.source.tokens_per_byte or [], strict=True))
    # "bytes" gives a token per UTF-8 byte of the text plus BOS and EOS; a sample's bytes are
    # its JSON line, so the ratio is below one, and the short texts' JSON overhead shows.
    assert 0 < ratios["short"] < ratios["long"] < 1
    # Token shares follow the 1:1 weights, though far more short samples are drawn.
    assert abs(tokens["short"] / tokens["long"] - 1) < 0.1


def test_measured_ratios_are_frozen_into_checkpoints() -> None:
    full = [s["id"] for s in _mixture(lanes=2)]
    first = _mixture(lanes=2)
    it = iter(first)
    head = [next(it)["id"] for _ in range(777)]
    state = first.checkpoint()
    it.close()
    assert state["source"]["tokens_per_byte"] == first.source.tokens_per_byte
    second = _mixture(lanes=2)
    second.restore(state)  # adopts the checkpoint's ratios instead of measuring again
    assert second.source.tokens_per_byte == first.source.tokens_per_byte
    assert head + [s["id"] for s in second] == full


def test_a_token_mixture_without_ratios_or_tokenizer_says_what_to_do() -> None:
    ws = _mixture().source
    fresh = StaticMixtureWorkSource(ws.datasets, {"short": 1, "long": 1}, mixture_unit="tokens")
    with pytest.raises(ConfigError, match="tokens_per_byte for"):
        list(Pipeline(fresh, rank=0, world_size=1))

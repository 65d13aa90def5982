"""pack_sequences: documents kept as segments with their per-token fields aligned, the four
algorithms and their limits, exact resume, and a varlen-attention loss equal to running the
documents one at a time."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.ops.pack import PACK_ALGORITHMS, _fit

SEQ = 16


def tokens(i: int) -> dict[str, Any]:
    """Document ``i``: ``i % 23 + 1`` tokens, each ``1000 * (i + 1) + position``; its loss
    mask is 1 on odd positions (so misalignment shows)."""
    n = i % 23 + 1
    return {
        "id": i,
        "input_ids": [1000 * (i + 1) + p for p in range(n)],
        "loss_mask": [p % 2 for p in range(n)],
    }


def source(n: int = 150) -> StaticMixtureWorkSource:
    ds = Dataset.from_records("docs", [tokens(i) for i in range(n)], samples_per_shard=20)
    return StaticMixtureWorkSource([ds], seed=4, shuffle="global")


def rows_of(pipe: Pipeline, limit: int | None = None) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        async for row in pipe:
            got.append(row)
            if limit is not None and len(got) == limit:
                break
        return got

    return asyncio.run(go())


def check_rows(rows: list[dict[str, Any]], n: int, min_len: int = 1) -> tuple[float, int]:
    """Every token of every document exactly once, its mask and position aligned; returns
    (padding fraction, documents split)."""
    seen: dict[int, list[int]] = {}
    pad = 0
    for row in rows:
        assert set(row) >= {"input_ids", "positions", "segment_ids", "loss_mask"}
        assert all(len(v) == SEQ for v in (row["input_ids"], row["loss_mask"]))
        for t, pos, seg, mask in zip(
            row["input_ids"], row["positions"], row["segment_ids"], row["loss_mask"], strict=True
        ):
            if seg == 0:
                pad += 1
                assert mask == 0
                continue
            doc, p = divmod(int(t), 1000)
            assert p == pos and mask == p % 2
            seen.setdefault(doc - 1, []).append(p)
    want = {i: list(range(i % 23 + 1)) for i in range(n) if i % 23 + 1 >= min_len}
    assert {d: sorted(ps) for d, ps in seen.items()} == want
    split = sum(1 for d in want if sum(1 for r in rows if _has(r, d)) > 1)
    return pad / (len(rows) * SEQ), split


def _has(row: dict[str, Any], doc: int) -> bool:
    return bool(((row["input_ids"] // 1000 == doc + 1) & (row["segment_ids"] > 0)).any())


@pytest.mark.parametrize("algorithm", PACK_ALGORITHMS)
def test_every_token_once_with_its_fields_and_exact_resume(algorithm: str) -> None:
    def pipe() -> Pipeline:
        return Pipeline(source(), rank=0, world_size=1, lanes=2).pack_sequences(
            SEQ, algorithm, window=40
        )

    rows = rows_of(pipe())
    _, split = check_rows(rows, 150)
    if algorithm in ("first_fit", "best_fit"):
        assert split == sum(1 for i in range(150) if i % 23 + 1 > SEQ)  # only long ones
    first = pipe()
    head = rows_of(first, 11)
    again = pipe()
    again.restore(first.checkpoint())
    rest = rows_of(again)
    assert [r["input_ids"].tolist() for r in head + rest] == [r["input_ids"].tolist() for r in rows]
    assert [r["loss_mask"].tolist() for r in head + rest] == [r["loss_mask"].tolist() for r in rows]


def test_wrap_fills_rows_and_limits_hold() -> None:
    lengths = [10, 10, 10, 10, 3]  # 43 tokens: 4 rows unsplit, 3 wrapped
    spans = [[(0, n)] for n in lengths]
    plain = _fit(spans, SEQ, best=True, wrap=False, limit=None)
    wrapped = _fit(spans, SEQ, best=True, wrap=True, limit=None)
    used = [sum(b - a for _, a, b in r) for r in wrapped]
    assert all(u == SEQ for u in used[:-1])  # full but for the last
    assert len(wrapped) < len(plain) and sum(used) == sum(lengths)
    capped = _fit([[(0, 2)]] * 10, SEQ, best=True, wrap=False, limit=3)
    assert max(len(r) for r in capped) == 3 and len(capped) == 4
    rows = rows_of(
        Pipeline(source(), rank=0, world_size=1).pack_sequences(
            SEQ, "best_fit", min_sequence_length=5, max_sequences_per_bin=2
        )
    )
    check_rows(rows, 150, min_len=5)
    assert max(int(r["segment_ids"].max()) for r in rows) <= 2


def test_bad_arguments_are_config_errors() -> None:
    pipe = Pipeline(source())
    with pytest.raises(ConfigError, match="max_sequences_per_bin"):
        pipe.pack_sequences(SEQ, "concat", max_sequences_per_bin=2)
    with pytest.raises(ConfigError, match="algorithm"):
        pipe.pack_sequences(SEQ, "next_fit")
    with pytest.raises(ConfigError, match=r"no \['labels'\] fields"):
        list(pipe.pack_sequences(SEQ, fields=["labels"]))


def test_varlen_attention_loss_equals_documents_one_at_a_time() -> None:
    torch = pytest.importorskip("torch")
    docs = [tokens(i) for i in (3, 8, 15, 4, 10, 6)]
    ds = Dataset.from_records("d", docs, samples_per_shard=10)
    ws = StaticMixtureWorkSource([ds], seed=0, shuffle="none")
    pipe = Pipeline(ws, rank=0, world_size=1).pack_sequences(SEQ, "best_fit").batch(8)
    (batch,) = list(pipe.to_training())
    torch.manual_seed(0)
    vocab, dim = 40_000, 16
    emb, pos_emb = torch.nn.Embedding(vocab, dim), torch.nn.Embedding(SEQ, dim)
    qkv, head = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, vocab)

    def loss_sum(ids: Any, pos: Any, labels: Any, allowed: Any) -> Any:
        x = emb(ids) + pos_emb(pos)
        q, k, v = qkv(x).chunk(3, dim=-1)
        scores = (q @ k.transpose(-1, -2)) / dim**0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        out = head(x + torch.softmax(scores, dim=-1) @ v)
        return torch.nn.functional.cross_entropy(
            out.reshape(-1, vocab), labels.reshape(-1), ignore_index=-100, reduction="sum"
        )

    ids = torch.as_tensor(batch["input_ids"])
    pos = torch.as_tensor(batch["position_ids"])
    cu = batch["cu_seqlens"].tolist()  # FlashAttention's varlen boundaries, over the batch
    flat = ids.numel()
    doc_of = torch.zeros(flat, dtype=torch.long)
    for d, (a, b) in enumerate(itertools.pairwise(cu)):
        doc_of[a:b] = d
    causal = torch.ones(flat, flat, dtype=torch.bool).tril()
    block = (doc_of[:, None] == doc_of[None, :]) & causal  # block-diagonal, causal
    packed = loss_sum(
        ids.reshape(1, -1),
        pos.reshape(1, -1),
        torch.as_tensor(batch["labels"]).reshape(1, -1),
        block,
    )
    alone = 0.0
    for doc in docs:
        n = len(doc["input_ids"])
        d_ids = torch.as_tensor([doc["input_ids"]])
        mask = torch.as_tensor(doc["loss_mask"])
        labels = torch.full((1, n), -100)
        labels[0, :-1] = torch.where(mask[1:] == 1, d_ids[0, 1:], torch.tensor(-100))
        alone = alone + loss_sum(
            d_ids, torch.arange(n)[None], labels, torch.ones(n, n, dtype=torch.bool).tril()
        )
    assert torch.allclose(packed, alone, rtol=1e-5)
    assert int(batch["num_valid_tokens"]) == sum(sum(d["loss_mask"][1:]) for d in docs)

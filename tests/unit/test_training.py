"""to_training: labels, positions and varlen boundaries from token rows and packed batches."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import ConfigError
from zephon.ops.training import ToTraining

IGN = -100


def packed_row() -> dict[str, Any]:
    # two documents (3 and 4 tokens) and one pad
    return {
        "input_ids": np.array([5, 6, 7, 8, 9, 10, 11, 0], np.int32),
        "positions": np.array([0, 1, 2, 0, 1, 2, 3, 0], np.int32),
        "segment_ids": np.array([1, 1, 1, 2, 2, 2, 2, 0], np.int32),
    }


def test_a_packed_row() -> None:
    out = ToTraining()(packed_row())
    assert out["labels"].tolist() == [6, 7, IGN, 9, 10, 11, IGN, IGN]
    assert out["position_ids"].tolist() == [0, 1, 2, 0, 1, 2, 3, 0]
    assert out["cu_seqlens"].tolist() == [0, 3, 7, 8] and out["max_seqlen"] == 4
    assert out["num_valid_tokens"] == 5
    assert out["input_ids"].dtype == np.int64 and out["labels"].dtype == np.int64


def test_a_batch_of_rows_flattens_the_boundaries() -> None:
    a, b = packed_row(), packed_row()
    b["segment_ids"] = np.array([1, 1, 1, 1, 1, 1, 1, 1], np.int32)
    b["positions"] = np.arange(8, dtype=np.int32)
    batch = {k: np.stack([a[k], b[k]]) for k in a}
    out = ToTraining(attention_mask=True)(batch)
    assert out["labels"].shape == (2, 8)
    assert out["labels"][1].tolist() == [6, 7, 8, 9, 10, 11, 0, IGN]
    assert out["cu_seqlens"].tolist() == [0, 3, 7, 8, 16] and out["max_seqlen"] == 8
    assert out["attention_mask"].tolist()[0] == [1, 1, 1, 1, 1, 1, 1, 0]


def test_loss_mask_unpacked_rows_shift_off_and_renames() -> None:
    row = {"input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]}
    out = ToTraining(rename_fields={"input_ids": "tokens"}, dtype="int32")(row)
    assert out["labels"].tolist() == [IGN, 3, 4, IGN]  # only predicting masked-in tokens
    assert out["position_ids"].tolist() == [0, 1, 2, 3]
    assert "tokens" in out and "input_ids" not in out and out["labels"].dtype == np.int32
    hf = ToTraining(shift=False)(row)
    assert hf["labels"].tolist() == [IGN, IGN, 3, 4]  # Hugging Face shifts inside the model


def test_bad_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="input_ids"):
        ToTraining()({"text": "no tokens"})
    with pytest.raises(ConfigError, match="integer"):
        ToTraining(dtype="float32")
    with pytest.raises(ConfigError, match="shape"):
        ToTraining()({"input_ids": [1, 2, 3], "loss_mask": [1, 1]})
    # a batch of unpacked rows (batch() keeps rows of different lengths as a list)
    with pytest.raises(ConfigError, match=r"equal length \(pack.*holds rows of different lengths"):
        ToTraining()({"input_ids": [np.arange(3), np.arange(5)]})
    with pytest.raises(ConfigError, match="equal length"):
        ToTraining()({"input_ids": ["some", "text"]})
    assert ToTraining()({"input_ids": []})["num_valid_tokens"] == 0  # an empty document


def _tokens(sample: dict[str, Any]) -> dict[str, Any]:
    n = sample["id"] % 9 + 1
    return {"input_ids": np.arange(1, n + 1, dtype=np.int32) + 100 * sample["id"]}


def test_in_a_pipeline_after_pack_and_batch() -> None:
    ds = Dataset.from_records("r", [{"id": i} for i in range(120)], samples_per_shard=40)
    pipe = (
        Pipeline(StaticMixtureWorkSource([ds], seed=2), rank=0, world_size=1)
        .map(_tokens)
        .pack(16)
        .batch(4)
        .to_training()
    )
    batches = list(pipe)
    assert batches and "map(to_training" in pipe.explain()
    for b in batches:
        ids, seg, labels = b["input_ids"], b["segment_ids"], b["labels"]
        same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0)
        assert (labels[:, :-1][same] == ids[:, 1:][same]).all()
        assert (labels[:, :-1][~same] == IGN).all() and (labels[:, -1] == IGN).all()
        assert b["cu_seqlens"][-1] == ids.size


def _sees_provenance(sample: dict[str, Any]) -> dict[str, Any]:
    return {**sample, "seen": sample["_provenance"]["dataset"]}


@pytest.mark.parametrize("processes", [0, 2])
def test_provenance_names_dataset_shard_and_sample(processes: int) -> None:
    a = Dataset.from_records("a", [{"id": i} for i in range(50)], samples_per_shard=20)
    b = Dataset.from_records("b", [{"id": 1000 + i} for i in range(30)], samples_per_shard=7)
    ws = StaticMixtureWorkSource([a, b], seed=4, shuffle="global")
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2, provenance=True)
    samples = list(pipe.map(_sees_provenance, processes=processes))
    assert len(samples) == 80
    # each dataset's samples in shard order: (shard URI, index in shard) -> id
    where = {}
    for ds in (a, b):
        at = 0
        for sh in ds.shards:
            for k in range(sh.num_samples):
                where[(ds.name, sh.uri, k)] = ds.head(ds.num_samples)[at + k]["id"]
            at += sh.num_samples
    for s in samples:
        p = s["_provenance"]
        assert where[(p["dataset"], p["shard"], p["sample"])] == s["id"]
        assert s["seen"] == p["dataset"]
    batch = next(iter(Pipeline(ws, rank=0, world_size=1, provenance=True).batch(5)))
    assert [p["dataset"] for p in batch["_provenance"]] and len(batch["_provenance"]) == 5


def _texts() -> Dataset:
    rows = [{"id": i, "text": "x" * (i * 7 % 40)} for i in range(60)]
    return Dataset.from_records("t", rows, samples_per_shard=20)


def test_tokenize_special_tokens_padding_and_masks() -> None:
    ws = StaticMixtureWorkSource([_texts()], shuffle="none")
    base = Pipeline(ws, rank=0, world_size=1)
    for name, head, tail in (
        ("bos_eos", [256], [257]),
        ("bos", [256], []),
        ("eos", [], [257]),
        ("none", [], []),
    ):
        s = next(iter(base.tokenize("bytes", special_tokens=name)))
        assert s["input_ids"].tolist() == head + [ord("x")] * len(s["text"]) + tail
    padded = list(
        base.tokenize("bytes", max_length=16, padding="max_length", pad_id=9, attention_mask=True)
    )
    for s in padded:
        n = min(16, len(s["text"]) + 2)
        assert len(s["input_ids"]) == 16 and s["attention_mask"].tolist() == [1] * n + [0] * (
            16 - n
        )
        assert (s["input_ids"][n:] == 9).all()
    with pytest.raises(ConfigError, match="special_tokens"):
        base.tokenize("bytes", special_tokens="both")
    with pytest.raises(ConfigError, match="max_length"):
        base.tokenize("bytes", padding=True)


def test_split_long_samples_keeps_every_token_and_resumes_exactly() -> None:
    ws = StaticMixtureWorkSource([_texts()], seed=3, shuffle="global")

    def pipe() -> Pipeline:
        return Pipeline(ws, rank=0, world_size=1, lanes=2).tokenize(
            "bytes", max_length=8, split_long_samples=True
        )

    full = [(s["id"], s.get("piece", 0), s["input_ids"].tolist()) for s in pipe()]
    assert all(len(ids) <= 8 for _, _, ids in full)
    by_id: dict[int, list[int]] = {}
    for i, _, ids in sorted(full, key=lambda x: (x[0], x[1])):
        by_id.setdefault(i, []).extend(ids)
    assert all(by_id[i] == [256] + [ord("x")] * (i * 7 % 40) + [257] for i in range(60))
    for cut in (1, 37, len(full) - 1):
        first = pipe()
        it = iter(first)
        head = [next(it) for _ in range(cut)]
        state = first.checkpoint()
        it.close()
        again = pipe()
        again.restore(state)
        rest = [(s["id"], s.get("piece", 0), s["input_ids"].tolist()) for s in again]
        got = [(s["id"], s.get("piece", 0), s["input_ids"].tolist()) for s in head] + rest
        assert got == full, cut


def _long(sample: dict[str, Any]) -> dict[str, Any]:
    return {"input_ids": np.arange(1, 41 + sample["id"], dtype=np.int32)}  # 40+ tokens


@pytest.mark.parametrize("algorithm", ["concat", "best_fit_wrap"])
def test_position_ids_of_documents_split_across_rows(algorithm: str) -> None:
    """Documents longer than a row are split across rows: by default each part's position
    ids restart in its row (a model with learned positions sized to the row indexes them);
    ``position_ids="document"`` continues them (once the default, up to 1,322 in rows of
    256)."""
    ds = Dataset.from_records("r", [{"id": i} for i in range(30)], samples_per_shard=10)
    pipe = (
        Pipeline(StaticMixtureWorkSource([ds], seed=2, stop_after_passes=1), rank=0, world_size=1)
        .map(_long)
        .pack(16, algorithm=algorithm)
    )
    rows = list(pipe.to_training())
    assert max(int(r["position_ids"].max()) for r in rows) < 16
    for r in rows:  # restarting at every document start and at the start of the row
        seg, pos = r["segment_ids"], r["position_ids"]
        starts = np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]])
        assert (pos[starts] == 0).all()
    continued = list(pipe.to_training(position_ids="document"))
    assert max(int(r["position_ids"].max()) for r in continued) >= 40
    assert [r["input_ids"].tolist() for r in continued] == [r["input_ids"].tolist() for r in rows]
    with pytest.raises(ConfigError, match="position_ids must be one of"):
        pipe.to_training(position_ids="absolute")  # type: ignore[arg-type]


def test_a_training_batch_carries_position_ids_not_positions_too() -> None:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource

    ds = Dataset.from_records("t", [{"text": "hello world " * 3} for _ in range(20)])
    pipe = Pipeline(StaticMixtureWorkSource([ds])).tokenize("bytes").pack_sequences(16).batch(2)
    batch = next(iter(pipe.to_training()))
    assert "position_ids" in batch and "positions" not in batch

"""to_training: token rows or batches made ready for a causal language model's loss.

Works on what ``tokenize`` gives (``input_ids``, optionally ``loss_mask``) and on what ``pack``
gives (also ``positions`` and ``segment_ids``, 0 on padding), one row or a batch of rows
(after ``batch``; 2-D arrays). Adds:

- ``labels``: the next token of the same document, ``ignore_index`` where there is none (the
  last token of a document, padding, across a document boundary inside a packed row) and where
  ``loss_mask`` of the predicted token is 0. ``labels[t]`` is the target of position ``t``: the
  shift is done here, so a loss is ``cross_entropy(logits.flatten(0, 1), labels.flatten())``
  (Hugging Face models shift again inside; pass ``shift=False`` for them).
- ``position_ids``: restarting at 0 in every document (it replaces ``pack``'s ``positions``,
  which a training batch does not carry too). A document that ``pack`` split across
  rows: with ``position_ids="row"`` (the default) its part in the next row restarts at 0
  too, so every id is below the row length (what a model with learned positions sized to the
  row needs); with ``"document"`` it continues where the previous row stopped (``positions``
  as ``pack`` gives them: up to the document's length).
- ``cu_seqlens`` (int32) and ``max_seqlen``: document boundaries over the flattened batch, as
  variable-length attention kernels take them (padding is its own segment at the end of a row).
- ``attention_mask`` (1 on tokens, 0 on padding) if asked, and ``num_valid_tokens``.

Ids and labels are ``dtype`` (int64 by default: ``torch.nn.functional.cross_entropy`` wants
Long targets). ``rename_fields`` renames outputs last (e.g. ``{"input_ids": "tokens"}``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from zephon.choices import PositionIds
from zephon.errors import ConfigError

__all__ = ["POSITION_IDS", "PositionIds", "ToTraining"]

POSITION_IDS: tuple[PositionIds, ...] = ("row", "document")


class ToTraining:
    """The callable ``Pipeline.to_training`` maps over rows or batches (picklable)."""

    __name__ = "to_training"

    def __init__(
        self,
        ignore_index: int = -100,
        dtype: str = "int64",
        attention_mask: bool = False,
        shift: bool = True,
        rename_fields: Mapping[str, str] | None = None,
        field: str = "input_ids",
        position_ids: PositionIds = "row",
    ) -> None:
        if position_ids not in POSITION_IDS:
            raise ConfigError(f"position_ids must be one of {POSITION_IDS}, got {position_ids!r}")
        if np.dtype(dtype).kind not in "iu":
            raise ConfigError(f"to_training dtype must be an integer type, got {dtype!r}")
        self.ignore_index = ignore_index
        self.dtype = np.dtype(dtype)
        self.attention_mask = attention_mask
        self.shift = shift
        self.rename_fields = dict(rename_fields or {})
        self.field = field
        self.position_ids = position_ids

    def __repr__(self) -> str:
        return (
            f"to_training(ignore_index={self.ignore_index}, dtype={self.dtype.name}, "
            f"attention_mask={self.attention_mask}, shift={self.shift}, "
            f"rename_fields={self.rename_fields}, field={self.field!r}, "
            f"position_ids={self.position_ids!r})"
        )

    def __call__(self, item: Any) -> dict[str, Any]:
        if not isinstance(item, dict) or self.field not in item:
            raise ConfigError(
                f"to_training() needs a {self.field!r} field: tokenize (and pack) first, got "
                f"{type(item).__name__}"
            )
        try:
            ids = np.asarray(item[self.field])
        except ValueError:  # numpy refuses a batch of rows of different lengths
            ids = None
        if ids is None or ids.ndim not in (1, 2) or (ids.size and ids.dtype.kind not in "iu"):
            what = "rows of different lengths" if ids is None else f"shape {ids.shape}"
            raise ConfigError(
                f"to_training() needs token rows of equal length (pack, or batch "
                f"after pack); {self.field!r} holds {what}"
            )
        single = ids.ndim == 1
        rows = ids[None, :] if single else ids
        seg = _rows(item.get("segment_ids"), rows.shape, single, np.ones(rows.shape, np.int32))
        mask = _rows(item.get("loss_mask"), rows.shape, single, np.ones(rows.shape, np.int8))
        if "positions" in item and self.position_ids == "document":
            pos = _rows(item["positions"], rows.shape, single, None)
        else:
            pos = _positions(seg)
        labels = self._labels(rows, seg, mask)
        cu, longest = _cu_seqlens(seg)
        out = dict(item)
        out.pop("positions", None)  # pack's; position_ids replaces it (one name, not two)
        out[self.field] = rows.astype(self.dtype)
        out["labels"] = labels
        out["position_ids"] = pos.astype(self.dtype)
        out["cu_seqlens"], out["max_seqlen"] = cu, longest
        out["num_valid_tokens"] = int(np.count_nonzero(labels != self.ignore_index))
        if self.attention_mask:
            out["attention_mask"] = (seg != 0).astype(np.int64)
        if single:
            for key in (self.field, "labels", "position_ids", "attention_mask"):
                if key in out and isinstance(out[key], np.ndarray) and out[key].ndim == 2:
                    out[key] = out[key][0]
        for old, new in self.rename_fields.items():
            if old in out:
                out[new] = out.pop(old)
        return out

    def _labels(self, rows: np.ndarray, seg: np.ndarray, mask: np.ndarray) -> np.ndarray:
        labels = np.full(rows.shape, self.ignore_index, dtype=self.dtype)
        if not self.shift:
            keep = (seg != 0) & (mask != 0)
            labels[keep] = rows[keep]
            return labels
        # position t predicts token t+1 if it is in the same (real) document and counts
        same = (seg[:, 1:] == seg[:, :-1]) & (seg[:, 1:] != 0) & (mask[:, 1:] != 0)
        labels[:, :-1][same] = rows[:, 1:][same]
        return labels


def _rows(value: Any, shape: tuple[int, ...], single: bool, default: Any) -> np.ndarray:
    if value is None:
        if default is None:
            raise ConfigError("to_training(): a field is missing")
        return np.asarray(default)
    arr = np.asarray(value)
    arr = arr[None, :] if single and arr.ndim == 1 else arr
    if arr.shape != shape:
        raise ConfigError(
            f"to_training(): a per-token field has shape {arr.shape}, the ids {shape}"
        )
    return arr


def _positions(seg: np.ndarray) -> np.ndarray:
    """0, 1, 2... restarting where the segment changes."""
    n = seg.shape[1]
    idx = np.broadcast_to(np.arange(n), seg.shape)
    starts = np.ones(seg.shape, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    first = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    out: np.ndarray = idx - first
    return out


def _cu_seqlens(seg: np.ndarray) -> tuple[np.ndarray, int]:
    """Boundaries of runs of equal segment ids over the flattened rows (a row boundary is
    always one), and the longest run."""
    b, n = seg.shape
    starts = np.ones(seg.shape, dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    flat = np.flatnonzero(starts.ravel())
    cu = np.append(flat, b * n).astype(np.int32)
    longest = int(np.diff(cu).max()) if len(cu) > 1 else 0
    return cu, longest

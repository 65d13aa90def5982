"""pack: token sequences into rows of exactly ``seq_len`` tokens, per lane.

Rows hold ``input_ids``, ``positions`` (restarting at 0 in each document, continuing where a
document was split) and ``segment_ids`` (1, 2, ... per document in the row; 0 for padding).

- ``concat``: documents end to end, split at row boundaries; no token is lost (the final row
  is padded). A row's mark is the mark before the document the *next* row starts in plus the
  token offset there, so a restore resumes mid-document exactly.
- ``first_fit`` / ``best_fit``: documents of a window of ``window`` documents are placed into
  rows (first row with room / the fullest row with room), padded with ``pad_id``; a document
  shorter than ``seq_len`` is never split; longer ones are cut into ``seq_len`` pieces first.
  Marks are window-relative, like ``shuffle``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from zephon.errors import ConfigError
from zephon.ops.block import Block, Mark, high_water, ref_at
from zephon.ops.shuffle import start_mark, windowed

__all__ = ["PACK_ALGORITHMS", "pack_blocks"]

PACK_ALGORITHMS = ("concat", "first_fit", "best_fit")


def _ids(item: Any, field: str) -> np.ndarray:
    try:
        ids = item[field] if isinstance(item, dict) else item
    except KeyError:
        raise ConfigError(f"pack() needs a {field!r} field (tokenize first)") from None
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        arr = arr.astype(np.int64)
    return arr.ravel()


def _row(pieces: list[tuple[np.ndarray, int]], seq_len: int, pad_id: int) -> dict[str, Any]:
    ids = np.full(seq_len, pad_id, dtype=np.int32)
    pos = np.zeros(seq_len, dtype=np.int32)
    seg = np.zeros(seq_len, dtype=np.int32)
    at = 0
    for s, (piece, first_pos) in enumerate(pieces, start=1):
        n = len(piece)
        ids[at : at + n] = piece
        pos[at : at + n] = np.arange(first_pos, first_pos + n)
        seg[at : at + n] = s
        at += n
    return {"input_ids": ids, "positions": pos, "segment_ids": seg}


async def _concat(
    blocks: AsyncIterator[Block], seq_len: int, pad_id: int, field: str, lane: int,
    depth: int, resume: tuple[Mark, int] | None,
) -> AsyncIterator[Block]:  # fmt: skip
    """Vectorised per block: the block's documents (after the previous block's unfinished
    row) are laid end to end in flat arrays and cut into rows with numpy. Long because the
    marks, positions and segments of the rows are computed from the same flat arrays in one
    pass."""
    before, offset = resume if resume is not None else (start_mark(lane, depth), 0)
    carry_ids = np.zeros(0, dtype=np.int32)  # the unfinished row
    carry_pos = np.zeros(0, dtype=np.int32)
    carry_doc = np.zeros(0, dtype=np.int32)  # document numbers, negative for carried ones
    carry_refs: dict[int, Any] = {}
    async for block in blocks:
        if not block.items:
            continue
        docs = [_ids(item, field) for item in block.items]
        if offset:  # restored mid-document: its first tokens are in rows already delivered
            docs[0] = docs[0][offset:]
        lengths = np.fromiter(map(len, docs), dtype=np.int32, count=len(docs))
        total = int(lengths.sum())
        starts = np.repeat(np.cumsum(lengths, dtype=np.int32) - lengths, lengths)
        pos = np.arange(total, dtype=np.int32) - starts
        if offset:
            pos[: lengths[0]] += offset
            offset = 0
        ids = np.concatenate([carry_ids, *docs]).astype(np.int32, copy=False)
        pos = np.concatenate([carry_pos, pos])
        doc = np.concatenate([carry_doc, np.repeat(np.arange(len(docs), dtype=np.int32), lengths)])
        provenance = block.provenance()

        def ref(d: int) -> Any:
            return carry_refs[d] if d < 0 else ref_at(provenance, d)  # noqa: B023

        full = len(ids) // seq_len
        rows: list[Any] = []
        row_refs: list[Any] = []
        row_marks: list[Mark] = []
        hw = high_water(block.mark(len(block.items) - 1))  # rows leave after the whole block
        if full:
            n = full * seq_len
            r_ids = ids[:n].reshape(full, seq_len)
            r_pos = pos[:n].reshape(full, seq_len)
            r_doc = doc[:n].reshape(full, seq_len)
            change = np.ones_like(r_doc, dtype=bool)
            change[:, 1:] = r_doc[:, 1:] != r_doc[:, :-1]
            seg = np.cumsum(change, axis=1, dtype=np.int32)
            first_docs, last_docs = r_doc[:, 0].tolist(), r_doc[:, -1].tolist()
            for r in range(full):  # rows are views of the block's arrays: no copy per row
                rows.append({"input_ids": r_ids[r], "positions": r_pos[r],
                             "segment_ids": seg[r]})  # fmt: skip
                row_refs.append([ref(d) for d in range(first_docs[r], last_docs[r] + 1)
                                 if d >= 0 or d in carry_refs])  # fmt: skip
                t = (r + 1) * seq_len  # where the next row starts
                if t < len(ids) and pos[t] > 0:  # ... inside document doc[t]
                    d = int(doc[t])
                    prev = block.mark(d - 1) if d > 0 else before
                    row_marks.append((*prev[:3], (*prev[3], int(pos[t])), hw))
                else:  # ... at the start of the document after doc[t - 1]
                    d = int(doc[t - 1])
                    prev = block.mark(d) if d >= 0 else before
                    row_marks.append((*prev[:3], (*prev[3], 0), hw))
        rest = slice(full * seq_len, None)
        carry_ids, carry_pos = ids[rest].copy(), pos[rest].copy()
        carry_refs = {int(d) - len(docs): ref(int(d)) for d in np.unique(doc[rest])}
        carry_doc = doc[rest] - len(docs)
        before = block.mark(len(block.items) - 1)
        if rows:
            yield Block(lane, rows, row_refs, row_marks)
    if len(carry_ids):
        seg = np.ones(len(carry_doc), dtype=bool)
        seg[1:] = carry_doc[1:] != carry_doc[:-1]
        row = {"input_ids": np.full(seq_len, pad_id, dtype=np.int32),
               "positions": np.zeros(seq_len, dtype=np.int32),
               "segment_ids": np.zeros(seq_len, dtype=np.int32)}  # fmt: skip
        k = len(carry_ids)
        row["input_ids"][:k] = carry_ids
        row["positions"][:k] = carry_pos
        row["segment_ids"][:k] = np.cumsum(seg)
        refs = [carry_refs[int(d)] for d in np.unique(carry_doc)]
        yield Block(lane, [row], [refs], [(*before[:3], (*before[3], 0), high_water(before))])


def _fit(docs: list[np.ndarray], seq_len: int, best: bool) -> list[list[tuple[np.ndarray, int]]]:
    pieces: list[tuple[np.ndarray, int]] = []
    for ids in docs:
        for s in range(0, max(len(ids), 1), seq_len):
            pieces.append((ids[s : s + seq_len], s))
    rows: list[list[tuple[np.ndarray, int]]] = []
    room: list[int] = []
    for piece in pieces:
        n = len(piece[0])
        candidates = [i for i, r in enumerate(room) if r >= n]
        if not candidates:
            rows.append([piece])
            room.append(seq_len - n)
            continue
        i = min(candidates, key=lambda c: (room[c], c)) if best else candidates[0]
        rows[i].append(piece)
        room[i] -= n
    return rows


def _fit_windows(
    blocks: AsyncIterator[Block], seq_len: int, pad_id: int, field: str, lane: int,
    depth: int, resume: tuple[Mark, int] | None, window: int, best: bool,
) -> AsyncIterator[Block]:  # fmt: skip
    def packed(_: Mark, items: list[Any], refs: list[Any]) -> tuple[list[Any], list[Any]]:
        rows = _fit([_ids(item, field) for item in items], seq_len, best)
        return [_row(r, seq_len, pad_id) for r in rows], [list(refs)] * len(rows)

    return windowed(blocks, window, lane, depth, resume, packed)


def pack_blocks(
    blocks: AsyncIterator[Block],
    seq_len: int,
    algorithm: str,
    pad_id: int,
    field: str,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
    window: int,
) -> AsyncIterator[Block]:
    if algorithm == "concat":
        return _concat(blocks, seq_len, pad_id, field, lane, depth, resume)
    return _fit_windows(
        blocks, seq_len, pad_id, field, lane, depth, resume, window, algorithm == "best_fit"
    )

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
from zephon.ops.block import Block, Mark
from zephon.ops.shuffle import start_mark, windowed

__all__ = ["PACK_ALGORITHMS", "pack_blocks"]

PACK_ALGORITHMS = ("concat", "first_fit", "best_fit")


def _ids(item: Any, field: str) -> np.ndarray:
    try:
        ids = item[field] if isinstance(item, dict) else item
    except KeyError:
        raise ConfigError(f"pack() needs a {field!r} field (tokenize first)") from None
    return np.asarray(ids, dtype=np.int64).ravel()


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
    before, offset = resume if resume is not None else (start_mark(lane, depth), 0)
    pieces: list[tuple[np.ndarray, int]] = []
    fill = 0
    refs: list[Any] = []
    async for block in blocks:
        rows, row_refs, row_marks = [], [], []
        for item, ref, mark in zip(block.items, block.refs, block.marks, strict=True):
            ids = _ids(item, field)
            start = offset  # tokens of this document already in earlier rows (restore)
            offset = 0
            while start < len(ids):
                take = min(seq_len - fill, len(ids) - start)
                pieces.append((ids[start : start + take], start))
                refs.append(ref)
                fill += take
                start += take
                if fill == seq_len:
                    rows.append(_row(pieces, seq_len, pad_id))
                    row_refs.append(refs)
                    if start < len(ids):  # the next row starts inside this document
                        row_marks.append((*before[:3], (*before[3], start)))
                    else:  # ... or at the next one
                        row_marks.append((*mark[:3], (*mark[3], 0)))
                    pieces, fill, refs = [], 0, []
            before = mark
        if rows:
            yield Block(lane, rows, row_refs, row_marks)
    if pieces:
        yield Block(lane, [_row(pieces, seq_len, pad_id)], [refs], [(*before[:3], (*before[3], 0))])


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

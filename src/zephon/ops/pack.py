"""pack: token sequences into rows of exactly ``seq_len`` tokens, per lane.

Rows hold ``input_ids``, ``positions`` (restarting at 0 in each document, continuing where a
document was split), ``segment_ids`` (1, 2, ... per document in the row; 0 for padding) and
the documents' other per-token fields (``loss_mask``, ...: every field as long as the ids,
or those named), cut and padded alongside the ids (padding 0). ``to_training`` turns
segments and positions into labels, ``position_ids`` and ``cu_seqlens``.

- ``concat``: documents end to end, split at row boundaries; no token is lost (the final row
  is padded). A row's mark is the mark before the document the *next* row starts in plus the
  token offset there, so a restore resumes mid-document exactly.
- ``first_fit`` / ``best_fit``: documents of a window of ``window`` documents are placed into
  rows (first row with room / the fullest row with room), padded with ``pad_id``; a document
  shorter than ``seq_len`` is never split; longer ones are cut into ``seq_len`` pieces first.
- ``best_fit_wrap``: best fit, but a document that fits in no open row is not given a new
  one: its head fills the row with the most room and the rest wraps on (into the best row
  for it, or a new one). Rows are full but for the window's last; more documents are split.

Fit algorithms take at most ``max_sequences_per_bin`` documents per row; marks are
window-relative, like ``shuffle``. Documents shorter than ``min_sequence_length`` are
dropped (the user asked for it).

A checkpoint restores under another ``seq_len`` or ``window`` (:meth:`Packing.adapt`):
``concat`` goes on from the token where the next undelivered row began, cutting rows of the
new length (the unfinished row is never saved, so nothing is carried over); a fit window the
checkpoint was inside is packed again under the old settings to find the pieces its
delivered rows held, and what is left of it is packed under the new ones. No token is lost
or repeated either way.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

import numpy as np

from zephon.choices import PackAlgorithm
from zephon.errors import ConfigError
from zephon.ops.block import Block, ref_at
from zephon.ops.marks import Mark, high_water, start_mark, with_state
from zephon.ops.operator import LaneContext, Operator, StreamOperator, is_count
from zephon.ops.windows import check_state, parse_state, windowed

__all__ = ["PACK_ALGORITHMS", "Packing", "pack_blocks"]

PACK_ALGORITHMS: tuple[str, ...] = get_args(PackAlgorithm)
_OWN = ("positions", "segment_ids")


@dataclass(frozen=True)
class Packing(StreamOperator):
    """The pack step: rows of ``seq_len`` tokens (see the module doc). ``fields``: the
    per-token fields carried (``None``: every field as long as the ids; ``()``: none)."""

    name: ClassVar[str] = "pack"
    stateful: ClassVar[bool] = True
    changeable: ClassVar[tuple[str, ...]] = ("seq_len", "window")

    seq_len: int
    algorithm: PackAlgorithm = "concat"
    pad_id: int = 0
    field: str = "input_ids"
    window: int = 1024
    fields: tuple[str, ...] | None = ()
    min_sequence_length: int = 1
    max_sequences_per_bin: int | None = None

    def __post_init__(self) -> None:
        if self.seq_len < 1:
            raise ConfigError(f"seq_len must be >= 1, got {self.seq_len}")
        if self.algorithm not in PACK_ALGORITHMS:
            raise ConfigError(f"algorithm must be one of {PACK_ALGORITHMS}, got {self.algorithm!r}")
        if self.window < 1 or self.min_sequence_length < 1:
            raise ConfigError("window and min_sequence_length must be >= 1")
        limit = self.max_sequences_per_bin
        if limit is not None and (limit < 1 or self.algorithm == "concat"):
            raise ConfigError(
                "max_sequences_per_bin must be >= 1, with a fit algorithm "
                "(concat splits documents at row boundaries)"
            )

    def label(self) -> str:
        return (
            f"pack({self.seq_len}, {self.algorithm}, pad_id={self.pad_id}, "
            f"field={self.field!r}, window={self.window}, fields={self.fields}, "
            f"min_sequence_length={self.min_sequence_length}, "
            f"max_sequences_per_bin={self.max_sequences_per_bin})"
        )

    def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        return pack_blocks(blocks, self, lane.lane, lane.depth, lane.resume)

    def adapt(self, state: Any, old: Operator) -> Any:
        """A checkpoint taken under another ``seq_len`` or ``window``. ``concat``'s state is
        a token offset into the next document, whatever the length: kept. A fit window the
        checkpoint was inside is replayed under its settings to find the pieces it had
        delivered, and the rest of it is packed under these; its state records them."""
        if self.algorithm == "concat" or state == 0:
            return state
        assert isinstance(old, Packing)
        skip, _, layers = parse_state(state, ())
        layer = {"seq_len": old.seq_len, "window": old.window, "skip": skip}
        return {"skip": 0, "layers": [*layers, layer]}

    def check_state(self, state: Any) -> None:
        if self.algorithm == "concat":
            if not is_count(state):
                raise ValueError("concat: a token offset")
            return
        check_state(state, ())

    def aligned(self, item: Any, n: int) -> list[str]:
        """The per-token fields of a document of ``n`` ids that rows carry."""
        if not isinstance(item, dict) or self.fields == ():
            return []
        if self.fields is not None:
            missing = [f for f in self.fields if f not in item]
            if missing:
                raise ConfigError(f"pack: documents have no {missing} fields")
            return list(self.fields)
        return [
            k
            for k, v in item.items()
            if k != self.field
            and k not in _OWN
            and isinstance(v, np.ndarray | list)
            and np.ndim(v) == 1
            and len(v) == n
        ]


def _ids(item: Any, field: str) -> np.ndarray:
    try:
        ids = item[field] if isinstance(item, dict) else item
    except KeyError:
        raise ConfigError(f"pack() needs a {field!r} field (tokenize first)") from None
    arr = np.asarray(ids)
    if arr.dtype.kind not in "iu":
        arr = arr.astype(np.int64)
    return arr.ravel()


def _docs(items: list[Any], spec: Packing) -> tuple[list[np.ndarray], dict[str, list[Any]]]:
    """The documents (ids; empty if shorter than ``min_sequence_length``) and their aligned
    fields."""
    docs = [_ids(item, spec.field) for item in items]
    names = spec.aligned(items[0], len(docs[0])) if docs else []
    fields: dict[str, list[Any]] = {name: [] for name in names}
    for i, (item, ids) in enumerate(zip(items, docs, strict=True)):
        for name in names:
            value = np.asarray(item.get(name) if isinstance(item, dict) else None)
            if value.ndim != 1 or len(value) != len(ids):
                raise ConfigError(
                    f"pack: field {name!r} of a document is not one value per "
                    f"token ({len(ids)} ids)"
                )
            fields[name].append(value)
        if len(ids) < spec.min_sequence_length:
            docs[i] = ids[:0]
            for name in names:
                fields[name][i] = fields[name][i][:0]
    return docs, fields


def _row(
    pieces: list[tuple[int, int, int]],
    docs: list[np.ndarray],
    fields: dict[str, list[Any]],
    spec: Packing,
) -> dict[str, Any]:
    """A row of ``pieces`` (document, start, stop), padded to ``seq_len``."""
    seq_len = spec.seq_len
    row = {
        "input_ids": np.full(seq_len, spec.pad_id, dtype=np.int32),
        "positions": np.zeros(seq_len, dtype=np.int32),
        "segment_ids": np.zeros(seq_len, dtype=np.int32),
    }
    for name, values in fields.items():
        row[name] = np.zeros(seq_len, dtype=values[0].dtype if values else np.int32)
    at = 0
    for s, (d, lo, hi) in enumerate(pieces, start=1):
        n = hi - lo
        row["input_ids"][at : at + n] = docs[d][lo:hi]
        row["positions"][at : at + n] = np.arange(lo, hi)
        row["segment_ids"][at : at + n] = s
        for name, values in fields.items():
            row[name][at : at + n] = values[d][lo:hi]
        at += n
    return row


def _cut(flat: dict[str, np.ndarray], full: int, seq_len: int) -> list[dict[str, Any]]:
    """``full`` rows out of flat arrays (views, no copy per row)."""
    shaped = {k: v[: full * seq_len].reshape(full, seq_len) for k, v in flat.items()}
    return [{k: v[r] for k, v in shaped.items()} for r in range(full)]


async def _concat(
    blocks: AsyncIterator[Block],
    spec: Packing,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
) -> AsyncIterator[Block]:
    """Vectorised per block: the block's documents (after the previous block's unfinished
    row) are laid end to end in flat arrays and cut into rows with numpy. Long because the
    marks, positions and segments of the rows are computed from the same flat arrays in one
    pass."""
    seq_len = spec.seq_len
    before, offset = resume if resume is not None else (start_mark(lane, depth), 0)
    carry: dict[str, np.ndarray] = {}  # the unfinished row: ids, positions, fields
    carry_doc = np.zeros(0, dtype=np.int32)  # document numbers, negative for carried ones
    carry_refs: dict[int, Any] = {}
    async for block in blocks:
        if not block.items:
            continue
        docs, fields = _docs(block.items, spec)
        if carry and set(carry) != {"input_ids", "positions", *fields}:
            raise ConfigError(
                "pack: documents carry different per-token fields "
                f"({sorted(carry)} before, {sorted(fields)} now)"
            )
        if offset:  # restored mid-document: its first tokens are in rows already delivered
            docs[0] = docs[0][offset:]
            fields = {k: [v[0][offset:], *v[1:]] for k, v in fields.items()}
        lengths = np.fromiter(map(len, docs), dtype=np.int32, count=len(docs))
        total = int(lengths.sum())
        starts = np.repeat(np.cumsum(lengths, dtype=np.int32) - lengths, lengths)
        pos = np.arange(total, dtype=np.int32) - starts
        if offset:
            pos[: lengths[0]] += offset
            offset = 0
        parts = {"input_ids": docs, "positions": [pos], **fields}
        flat = {
            k: np.concatenate([carry[k], *v]) if k in carry else np.concatenate(v)
            for k, v in parts.items()
        }
        flat["input_ids"] = flat["input_ids"].astype(np.int32, copy=False)
        ids = flat["input_ids"]
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
            r_doc = doc[: full * seq_len].reshape(full, seq_len)
            change = np.ones_like(r_doc, dtype=bool)
            change[:, 1:] = r_doc[:, 1:] != r_doc[:, :-1]
            seg = np.cumsum(change, axis=1, dtype=np.int32)
            rows = _cut(flat, full, seq_len)
            for r in range(full):
                rows[r]["segment_ids"] = seg[r]
                in_row = distinct_ordered(r_doc[r])
                row_refs.append([ref(d) for d in in_row if d >= 0 or d in carry_refs])
                t = (r + 1) * seq_len  # where the next row starts
                if t < len(ids) and flat["positions"][t] > 0:  # ... inside document doc[t]
                    d = int(doc[t])
                    prev = block.mark(d - 1) if d > 0 else before
                    row_marks.append(with_state(prev, int(flat["positions"][t]), hw))
                else:  # ... at the start of the document after doc[t - 1]
                    d = int(doc[t - 1])
                    prev = block.mark(d) if d >= 0 else before
                    row_marks.append(with_state(prev, 0, hw))
        rest = slice(full * seq_len, None)
        carry = {k: v[rest].copy() for k, v in flat.items()}
        carry_refs = {int(d) - len(docs): ref(int(d)) for d in np.unique(doc[rest])}
        carry_doc = doc[rest] - len(docs)
        before = block.mark(len(block.items) - 1)
        if rows:  # the block's fetched bytes go with its rows (channels weigh them)
            yield Block(lane, rows, row_refs, row_marks, block.nbytes)
    if carry and len(carry["input_ids"]):
        k = len(carry["input_ids"])
        seg = np.ones(k, dtype=bool)
        seg[1:] = carry_doc[1:] != carry_doc[:-1]
        row = {name: np.zeros(seq_len, dtype=v.dtype) for name, v in carry.items()}
        row["input_ids"][:] = spec.pad_id
        for name, v in carry.items():
            row[name][:k] = v
        row["segment_ids"] = np.zeros(seq_len, dtype=np.int32)
        row["segment_ids"][:k] = np.cumsum(seg)
        refs = [carry_refs[int(d)] for d in np.unique(carry_doc)]
        yield Block(lane, [row], [refs], [with_state(before, 0, high_water(before))])


def distinct_ordered(values: np.ndarray) -> list[int]:
    """The distinct values of a sorted run, in order."""
    keep = np.ones(len(values), dtype=bool)
    keep[1:] = values[1:] != values[:-1]
    return [int(v) for v in values[keep]]


Piece = tuple[int, int, int]  # (document, start, stop)


def _fit(
    spans: list[list[tuple[int, int]]], seq_len: int, best: bool, wrap: bool, limit: int | None
) -> list[list[Piece]]:
    """Rows of pieces (see the module doc) of the documents' ``spans``: per document, the
    token ranges to place (the whole document, or what a restore left of it)."""
    rows: list[list[Piece]] = []
    room: list[int] = []
    cap = limit if limit is not None else seq_len + 1

    def place(i: int, piece: Piece) -> None:
        if i == len(rows):
            rows.append([])
            room.append(seq_len)
        rows[i].append(piece)
        room[i] -= piece[2] - piece[1]

    for d, ranges in enumerate(spans):
        pieces = [(d, s, min(hi, s + seq_len)) for lo, hi in ranges for s in range(lo, hi, seq_len)]
        while pieces:
            piece = pieces.pop(0)
            size = piece[2] - piece[1]
            open_ = [i for i, r in enumerate(room) if len(rows[i]) < cap]
            fits = [i for i in open_ if room[i] >= size]
            if fits:
                place(min(fits, key=lambda c: (room[c], c)) if best else fits[0], piece)
            elif wrap and open_ and max(room[i] for i in open_) > 0:
                i = max(open_, key=lambda c: (room[c], -c))
                head = piece[1] + room[i]
                place(i, (d, piece[1], head))
                pieces.insert(0, (d, head, piece[2]))
            else:
                place(len(rows), piece)
    return rows


def _left(spans: list[list[tuple[int, int]]], delivered: list[list[Piece]]) -> list[list[Any]]:
    """What is left of the documents' ``spans`` once the pieces of ``delivered`` rows are
    taken out."""
    taken: dict[int, list[tuple[int, int]]] = {}
    for row in delivered:
        for d, lo, hi in row:
            taken.setdefault(d, []).append((lo, hi))
    out = []
    for d, ranges in enumerate(spans):
        cuts = sorted(taken.get(d, ()))
        rest = []
        for lo, hi in ranges:
            at = lo
            for a, b in cuts:
                if b <= at or a >= hi:
                    continue
                if a > at:
                    rest.append((at, a))
                at = max(at, b)
            if at < hi:
                rest.append((at, hi))
        out.append(rest)
    return out


def _fit_windows(
    blocks: AsyncIterator[Block],
    spec: Packing,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
) -> AsyncIterator[Block]:
    best = spec.algorithm != "first_fit"
    wrap = spec.algorithm == "best_fit_wrap"
    limit = spec.max_sequences_per_bin

    def packed(
        _: Mark, items: list[Any], refs: list[Any], __: int, layers: list[Any]
    ) -> tuple[list[Any], list[Any]]:
        docs, fields = _docs(items, spec)
        spans = [[(0, len(d))] if len(d) else [] for d in docs]
        for layer in layers:  # a window begun under other settings: what they delivered
            rows = _fit(spans, int(layer["seq_len"]), best, wrap, limit)
            spans = _left(spans, rows[: int(layer["skip"])])
        rows = _fit(spans, spec.seq_len, best, wrap, limit)
        out = [_row(r, docs, fields, spec) for r in rows]
        return out, [[refs[d] for d in dict.fromkeys(p[0] for p in r)] for r in rows]

    return windowed(blocks, spec.window, lane, depth, resume, packed)


def pack_blocks(
    blocks: AsyncIterator[Block],
    spec: Packing,
    lane: int,
    depth: int,
    resume: tuple[Mark, int] | None,
) -> AsyncIterator[Block]:
    if spec.algorithm == "concat":
        return _concat(blocks, spec, lane, depth, resume)
    return _fit_windows(blocks, spec, lane, depth, resume)

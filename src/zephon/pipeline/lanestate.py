"""A lane's checkpoint entry: written compactly, read back checked.

A checkpoint holds one entry per lane (see :mod:`zephon.pipeline.state`), in runs of
consecutive lanes (a rank's): ``"lane_runs": {"<first lane>": [entry, entry, ...]}``. The
usual entry, a lane inside its curriculum, is a list of numbers::

    [items, ended, chunk, delivered, counts, ops]        and, when its operators hold items,
    [items, ended, chunk, delivered, counts, ops, [chunks, delivered, counts]]

- ``items``: items the consumer received from the lane; ``ended``: 1 once it has ended;
- ``chunk``, ``counts``: the cursor of the chunk the last item came from (the chunk's index in
  the lane and, per dataset, the draws before it; its position is their sum);
- ``delivered``: pointers of that chunk delivered; ``ops``: the stateful operators' states;
- the last item, the high water (how far the operators had read) relative to the cursor:
  pointers of the cursor's chunk read (when it is in that chunk), or ``[chunks after it,
  pointers of that chunk, draws after the cursor's per dataset]``.

A state ``{"skip": s, "part": p}`` (a shuffle inside a part of its lane's first window) is
written ``[s, p]``.

A lane whose last item left before its first chunk's cursor (inside a shuffle's first
window) has ``null`` for ``chunk``, ``[]`` for ``counts`` and its high water counted from the
lane's start. A lane that has received nothing is ``[items, ended]``. Any other entry (a
lane replaying a residue after re-laning, a token mixture's cursor) is an object with the
fields ``items``, ``ended``, ``cursor``, ``delivered``, ``ops``, ``hw``, ``residues``, as
every entry of a version-1 checkpoint (``"lane_states": {"<lane>": entry}``) is; both are
read. Reading checks every field and names the one that is wrong: a corrupted checkpoint is
refused, never read as a restart.
"""

from __future__ import annotations

from typing import Any

from zephon.errors import StateMismatch

__all__ = ["check_cursor", "count", "decode", "encode", "lane_number"]


def encode(lane: int, entry: dict[str, Any]) -> list[Any] | dict[str, Any]:
    """The compact form of ``entry`` when it has the usual shape, else ``entry``."""
    items, ended = entry["items"], int(entry["ended"])
    if "delivered" not in entry:
        return [items, ended]
    cursor, hw = entry.get("cursor"), entry.get("hw")
    if "residues" in entry or not (cursor is None or _plain(cursor, lane)):
        return entry
    ops = [_pack_state(x) for x in entry["ops"]]
    base: dict[str, Any]
    if cursor is None:  # the lane's start: the high water, if any, counts from chunk 0
        base = {"chunk": 0, "counts": None}
        out = [items, ended, None, entry["delivered"], [], ops]
    else:
        base = cursor
        out = [items, ended, cursor["chunk"], entry["delivered"], cursor["counts"], ops]
    if hw is None:
        return out
    there = hw["cursor"]
    if not _plain(there, lane) or there["chunk"] < base["chunk"]:
        return entry
    before = base["counts"] or [0] * len(there["counts"])
    drawn = [b - a for a, b in zip(before, there["counts"], strict=True)]
    if min(drawn, default=0) < 0:
        return entry
    if there["chunk"] == base["chunk"] and not any(drawn):  # within the cursor's chunk
        return [*out, hw["delivered"]]
    return [*out, [there["chunk"] - base["chunk"], hw["delivered"], drawn]]


def _pack_state(state: Any) -> Any:
    """An operator state as the list form writes it: a window's ``{"skip": s, "part": p}``
    (a part of a lane's first window) as ``[s, p]``."""
    if isinstance(state, dict) and state.keys() == {"skip", "part"}:
        return [state["skip"], state["part"]]
    return state


def _plain(cursor: Any, lane: int) -> bool:
    """A cursor the list form holds: this lane's, no token counts, position = draws."""
    return (
        isinstance(cursor, dict)
        and cursor.get("lane") == lane
        and "tokens" not in cursor
        and "base" not in cursor
        and cursor.get("position") == sum(cursor.get("counts", ()))
    )


def lane_number(key: Any, where: str) -> int:
    """A lane number written as a JSON object's key."""
    if not (isinstance(key, str) and key.isdigit() and key.isascii()):
        raise StateMismatch(f"checkpoint field {where}: {_show(key)} is not a lane number")
    return int(key)


def decode(lane: int, value: Any, where: str, datasets: int) -> dict[str, Any]:
    """The entry of ``lane`` (the checkpoint's field ``where``) as an object, checked; the
    curriculum mixes ``datasets`` datasets.

    Raises:
        StateMismatch: a field is missing or of the wrong kind (naming it).
    """
    if isinstance(value, dict):
        return _checked(value, lane, where)
    if not isinstance(value, list) or len(value) not in (2, 6, 7):
        raise StateMismatch(f"checkpoint field {where}: not a lane entry ({_show(value)})")
    entry: dict[str, Any] = {
        "items": count(value[0], f"{where} items"),
        "ended": bool(count(value[1], f"{where} ended")),
    }
    if len(value) == 2:
        return entry
    start = value[2] is None  # the lane's start: no cursor
    chunk = 0 if start else count(value[2], f"{where} chunk")
    delivered = count(value[3], f"{where} delivered")
    counts = _counts(value[4], f"{where} counts")
    if start and counts:
        raise StateMismatch(f"checkpoint field {where} counts: a lane's start has none")
    entry["cursor"] = None if start else _cursor(lane, chunk, counts)
    entry["delivered"] = delivered
    ops = value[5]
    if isinstance(ops, list):
        ops = [_unpack_state(x, f"{where} ops") for x in ops]
    entry["ops"] = _ops(ops, f"{where} ops")
    if len(value) == 7:
        hw = value[6]
        if not isinstance(hw, list):  # in the cursor's chunk (the first, at the start)
            hw = [0, hw, [0] * (datasets if start else len(counts))]
        if not isinstance(hw, list) or len(hw) != 3:
            raise StateMismatch(f"checkpoint field {where} hw: not [chunks, delivered, counts]")
        drawn = _counts(hw[2], f"{where} hw counts")
        if not start and len(drawn) != len(counts):
            raise StateMismatch(f"checkpoint field {where} hw counts: {len(drawn)} datasets")
        there = drawn if start else [a + b for a, b in zip(counts, drawn, strict=True)]
        entry["hw"] = {
            "cursor": _cursor(lane, chunk + count(hw[0], f"{where} hw chunks"), there),
            "delivered": count(hw[1], f"{where} hw delivered"),
        }
    return entry


def _unpack_state(state: Any, where: str) -> Any:
    if isinstance(state, list):
        if len(state) != 2:
            raise StateMismatch(f"checkpoint field {where}: {_show(state)} is no window state")
        return {"skip": count(state[0], where), "part": count(state[1], where)}
    return state


def _cursor(lane: int, chunk: int, counts: list[int]) -> dict[str, Any]:
    return {"lane": lane, "chunk": chunk, "position": sum(counts), "counts": counts}


def _checked(entry: dict[str, Any], lane: int, where: str) -> dict[str, Any]:
    """An entry in object form, its fields checked."""
    out = dict(entry)
    out["items"] = count(entry.get("items", 0), f"{where} items")
    if not isinstance(entry.get("ended", False), bool):
        raise StateMismatch(f"checkpoint field {where} ended: {_show(entry['ended'])}")
    for name in ("cursor", "hw"):
        cursor = entry.get(name)
        if name == "hw" and cursor is not None:
            if not isinstance(cursor, dict):
                raise StateMismatch(f"checkpoint field {where} hw: {_show(cursor)}")
            count(cursor.get("delivered"), f"{where} hw delivered")
            cursor = cursor.get("cursor")
        if cursor is not None:
            check_cursor(cursor, f"{where} {name}")
    if "delivered" in entry:
        out["delivered"] = count(entry["delivered"], f"{where} delivered")
        out["ops"] = _ops(entry.get("ops"), f"{where} ops")
    residues = entry.get("residues", [])
    if not isinstance(residues, list) or not all(isinstance(r, dict) for r in residues):
        raise StateMismatch(f"checkpoint field {where} residues: {_show(residues)}")
    return out


def check_cursor(cursor: Any, where: str) -> None:
    """Refuse a cursor object with a field missing or of the wrong kind (naming it)."""
    if not isinstance(cursor, dict):
        raise StateMismatch(f"checkpoint field {where}: {_show(cursor)}")
    for field in ("lane", "chunk", "position"):
        count(cursor.get(field), f"{where} {field}")
    counts = _counts(cursor.get("counts"), f"{where} counts")
    if cursor.get("base") is not None:
        base = _counts(cursor["base"], f"{where} base")
        if len(base) != len(counts) or any(b > c for b, c in zip(base, counts, strict=True)):
            raise StateMismatch(f"checkpoint field {where} base: {_show(base)} past the counts")
    for name in ("tokens", "base_tokens"):
        tokens = cursor.get(name)
        if tokens is not None and not (
            isinstance(tokens, list)
            and all(isinstance(t, int | float) and not isinstance(t, bool) for t in tokens)
        ):
            raise StateMismatch(f"checkpoint field {where} {name}: {_show(tokens)}")


def _ops(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list) or not all(
        isinstance(x, dict) or (isinstance(x, int) and not isinstance(x, bool)) for x in value
    ):
        raise StateMismatch(f"checkpoint field {where}: not a list of states ({_show(value)})")
    return value


def _counts(value: Any, where: str) -> list[int]:
    if not isinstance(value, list):
        raise StateMismatch(f"checkpoint field {where}: not a list ({_show(value)})")
    return [count(v, where) for v in value]


def count(value: Any, where: str) -> int:
    """A non-negative integer."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise StateMismatch(f"checkpoint field {where}: not a count ({_show(value)})")
    return value


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

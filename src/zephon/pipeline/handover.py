"""Handover: a checkpoint restored into another lane count, with the items its operators held.

Re-laning cuts every old lane at a point and deals what is left of the curriculum to the new
lanes (:mod:`zephon.plan.relane`). Where a lane's stateful steps (a shuffle window, a pack
row, a custom ``apply`` with state) held items at the checkpoint, the cut is the lane's
*high water*: how far into the lane those steps had read when the checkpoint's last item left
them (every mark carries it). The part between the checkpoint's position and the high water
is the lane's *residue*: replaying the old lane over exactly that part, from its checkpoint
with its operator states, gives the items already delivered (skipped, as on any restore) and
then everything the steps held, flushed at the residue's end. The residue goes to new lane
``r % new_lanes`` (``r`` counting residues in old lane order), which replays it before its own
curriculum. Nothing is lost or repeated; a residue is a few numbers in the checkpoint and a
checkpoint taken while one is replayed records where in it the consumer is, so the run can be
restored, or re-laned again, at any point.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from zephon.errors import StateMismatch
from zephon.ops.marks import (
    Mark,
    Position,
    Residue,
    cursor_of,
    hw_of,
    new_mark,
    op_states,
    position_of,
)
from zephon.pipeline.spec import PipelineSpec
from zephon.refs import Cursor

__all__ = ["lane_entry", "relane", "residue_end", "residue_resume"]


def _position_json(position: Position) -> dict[str, Any]:
    cursor, delivered = position
    assert not isinstance(cursor, Residue)
    return {"cursor": cursor.to_dict() if cursor is not None else None, "delivered": delivered}


def _position(data: dict[str, Any]) -> tuple[Cursor | None, int]:
    cursor = data.get("cursor")
    return (Cursor.from_dict(cursor) if cursor else None), int(data["delivered"])


def _busy(ops: Any) -> bool:
    return any(op != 0 for op in ops)


def lane_entry(mark: Mark, stateful_steps: int) -> dict[str, Any]:
    """A lane's checkpoint entry (position, operator states, high water if they hold items,
    residues still to replay) after the item of ``mark``."""
    cursor, ops, hw = cursor_of(mark), op_states(mark), hw_of(mark)
    if isinstance(cursor, Residue):  # inside a residue: its own curriculum not started yet
        at = cursor.at
        current = {**cursor.record, **_position_json(position_of(at)), "ops": list(op_states(at))}
        return {
            "cursor": None,
            "delivered": 0,
            "ops": [0] * stateful_steps,
            "residues": [current, *cursor.rest],
        }
    entry: dict[str, Any] = {**_position_json(position_of(mark)), "ops": list(ops)}
    if hw is not None and _busy(ops):
        entry["hw"] = _position_json(hw)
    return entry


def residue_resume(spec: PipelineSpec, record: dict[str, Any]) -> tuple[tuple[int, ...], Any]:
    """``(the operator states of a lane that has not started, the resume entry of the old
    lane)`` for replaying the residue ``record``."""
    cursor, delivered = _position(record)
    ops = tuple(x if isinstance(x, dict) else int(x) for x in record["ops"])
    if len(ops) != spec.stateful_steps:
        raise StateMismatch("checkpoint's operator states do not match the chain")
    lane, lanes = int(record["lane"]), int(record["lanes"])
    mark = new_mark(lane, cursor, delivered, ops, _position(record["hw"]))
    state = None if cursor is None else spec.source.state(cursor, delivered, lanes)
    return (0,) * spec.stateful_steps, {"state": state, "mark": mark}


def residue_end(record: dict[str, Any]) -> int:
    """The residue's cut: its old lane's position (pointers from the lane's start)."""
    cursor, delivered = _position(record["hw"])
    return (cursor.position if cursor is not None else 0) + delivered


def relane(
    spec: PipelineSpec, state: dict[str, Any], history: list[Any], past: Any = None
) -> tuple[list[Any], dict[int, list[dict[str, Any]]]]:
    """A checkpoint of another lane count: every old lane is cut at its checkpoint (at its
    high water if its operators held items, which then becomes a residue); what is left
    becomes a new generation of the curriculum dealt to this pipeline's lanes
    (:mod:`zephon.plan.relane`). Returns the new history and, per new lane, the residues
    it replays first. Needs every old lane's entry. ``past``: the work source the old lanes
    were planned by, if a change to the curriculum's future changed its end counts (they are
    then recorded with the new generation)."""
    source = past if past is not None else spec.source
    old = int(state["lanes"])
    if state.get("source") != source.describe():
        source.check_state(
            {
                "describe": state.get("source"),
                "cursor": source.start(0).to_dict(),
                "delivered": 0,
                "lanes": old,
            },
            old,
        )  # raises
    entries = state.get("lane_states", {})
    missing: list[int] = []  # the first few (a corrupt lane count may be huge)
    lane = 0
    while lane < old and len(missing) < 8:
        if str(lane) not in entries:
            missing.append(lane)
        lane += 1
    if missing:
        more = " and more" if len(missing) == 8 and lane < old else ""
        raise StateMismatch(
            f"restoring a {old}-lane checkpoint into {spec.lanes} lanes needs every old lane, "
            f"and lanes {missing}{more} are missing: join every rank's checkpoint with "
            "Pipeline.merge_checkpoints"
        )
    splits = source.splits(old, history)
    cuts: list[list[int]] = []
    residues: list[dict[str, Any]] = []
    for lane in range(old):
        entry = entries[str(lane)]
        residues += entry.get("residues", [])
        if entry.get("ended"):
            cuts.append([split.quota(lane) or 0 for split in splits])
            continue
        if not entry.get("cursor") and not _busy(entry.get("ops", ())):
            cuts.append([0] * len(splits))
            continue
        cut = entry
        if _busy(entry.get("ops", ())):
            if "hw" not in entry:
                raise StateMismatch(
                    f"lane {lane}'s operators held items when the checkpoint was taken and it "
                    f"does not say how far they had read; restore it with lanes={old}"
                )
            cut = entry["hw"]
            held = {k: entry[k] for k in ("cursor", "delivered", "ops", "hw")}
            residues.append({"lanes": old, "generation": len(history), "lane": lane, **held})
        cuts.append(_draws(source, lane, old, history, cut, len(splits)))
    by_lane: dict[int, list[dict[str, Any]]] = {}
    for r, record in enumerate(residues):
        by_lane.setdefault(r % spec.lanes, []).append(record)
    ends = source.end_counts() if past is not None else None
    if past is not None and ends is None:
        ends = [None] * len(cuts[0])
    return spec.source.relane(old, history, cuts, spec.lanes, ends), by_lane


def _draws(
    source: Any, lane: int, lanes: int, history: list[Any], at: dict[str, Any], datasets: int
) -> list[int]:
    """Draws of each dataset the lane had made at position ``at``."""
    cursor, delivered = _position(at)
    if cursor is None:
        return [0] * datasets
    chunk = next(source.chunks(lane, lanes, cursor, history))
    taken = np.bincount(chunk.datasets[:delivered], minlength=datasets)
    return [int(c) for c in np.asarray(cursor.counts) + taken]

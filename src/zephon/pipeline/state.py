"""Consumer state: what the consumer received, as a checkpoint, and a checkpoint read back.

The checkpoint is derived from delivered items only: each item carries its mark (lane,
chunk cursor, pointers of that chunk delivered, states of the stateful steps), and the
consumer side keeps the last mark and an item count per lane. Nothing buffered is saved;
work in flight is planned again on restore.
"""

from __future__ import annotations

import operator
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zephon.errors import ConfigError, StateMismatch
from zephon.ops.block import Block
from zephon.ops.marks import Mark, new_mark
from zephon.ops.operator import Operator
from zephon.pipeline.changes import adapted, changes
from zephon.pipeline.handover import lane_entry, relane
from zephon.pipeline.lanestate import check_cursor, count, decode, encode, lane_number
from zephon.pipeline.spec import PipelineSpec
from zephon.plan.worksource import FUTURE
from zephon.refs import Cursor

__all__ = [
    "Received",
    "Resume",
    "checkpoint",
    "lane_entries",
    "merge_checkpoints",
    "merge_start",
    "restore",
]

CHECKPOINT_VERSION = 2  # lane entries compact (see zephon.pipeline.lanestate); 1 is read too
VERSIONS = (1, 2)
_ENTRY = ("cursor", "delivered", "ops", "hw", "residues")  # a lane's position in a checkpoint


class Received:
    """What the consumer has received, per lane: the last mark and the item count of each.

    The consumer takes the open block's items from the iterator :meth:`open` returns, so how
    many it has received is how far that iterator has got; the open block's marks are folded in
    when the next block opens or a checkpoint is taken, so delivery costs nothing per item.
    """

    __slots__ = ("_left", "_size", "block", "ended", "items", "position", "settled")

    def __init__(self, items: dict[int, int] | None = None, ended: frozenset[int] = frozenset()):
        self.position: dict[int, Mark] = {}
        self.items: dict[int, int] = dict(items or {})
        self.ended = ended
        self.block: Block | None = None
        self.settled = 0
        self._left: Iterator[Any] = iter(())
        self._size = 0

    def open(self, block: Block, items: list[Any]) -> Iterator[Any]:
        """Start handing out ``block`` (its ``items``, converted for the consumer)."""
        self.settle()
        self.block, self.settled = block, 0
        self._left, self._size = iter(items), len(items)
        return self._left

    @property
    def taken(self) -> int:
        """Items of the open block handed to the consumer."""
        return self._size - operator.length_hint(self._left)

    def settle(self) -> None:
        """Fold the items taken from the open block into the per-lane positions."""
        block = self.block
        if block is None or self.taken == self.settled:
            return
        if block.lane >= 0:  # one lane's block: its last received mark says it all
            lane = block.lane
            self.position[lane] = block.mark(self.taken - 1)
            self.items[lane] = self.items.get(lane, 0) + self.taken - self.settled
        else:
            for lane, (n, mark) in block.progress(self.settled, self.taken).items():
                self.position[lane] = mark
                self.items[lane] = self.items.get(lane, 0) + n
        self.ended = self.ended | block.extra.get("ended", frozenset())
        self.settled = self.taken

    def release(self) -> None:
        """Settle, then let go of the open block: the iteration is over, and its items (and
        the lane blocks a merged block refers to) should not outlive it."""
        self.settle()
        self.block, self.settled = None, 0
        self._left, self._size = iter(()), 0


@dataclass
class Resume:
    """Where a restored pipeline starts: per lane, the planner state and the mark the
    stateful steps resume from; and the consumer counts carried over."""

    lanes: dict[int, dict[str, Any]] = field(default_factory=dict)
    items: dict[int, int] = field(default_factory=dict)
    ended: frozenset[int] = frozenset()
    history: list[dict[str, Any]] = field(default_factory=list)  # re-laning generations

    def received(self) -> Received:
        """A consumer state that continues the checkpoint's counts."""
        return Received(self.items, self.ended)


def checkpoint(spec: PipelineSpec, received: Received, resume: Resume) -> dict[str, Any]:
    """JSON state of what the consumer has received, for this rank's lanes. A lane the
    consumer has not reached since a restore keeps its restored entry."""
    received.settle()
    lanes: list[Any] = []
    for lane in spec.my_lanes:
        entry: dict[str, Any] = {
            "items": received.items.get(lane, 0),
            "ended": lane in received.ended,
        }
        if lane in received.position:
            entry.update(lane_entry(received.position[lane], spec.stateful_steps))
        elif lane in resume.lanes:
            restored = resume.lanes[lane]
            entry.update({k: restored[k] for k in _ENTRY if k in restored})
        lanes.append(encode(lane, entry))
    runs = {str(spec.my_lanes.start): lanes}  # a rank's lanes are consecutive
    out = {"zephon_checkpoint": CHECKPOINT_VERSION, **spec.identity(), "lane_runs": runs}
    if resume.history:
        out["history"] = resume.history
    return out


def lane_entries(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A checkpoint's lane entries as objects, checked (see :mod:`zephon.pipeline.lanestate`).

    Raises:
        StateMismatch: an entry is malformed (naming the field).
    """
    old, runs = state.get("lane_states", {}), state.get("lane_runs", {})
    if not isinstance(old, dict) or not isinstance(runs, dict):
        raise StateMismatch("checkpoint field lane_states or lane_runs: not an object")
    source = state.get("source")
    named = source.get("datasets") if isinstance(source, dict) else None
    datasets = len(named) if isinstance(named, list) else 0
    out = {}
    for key, value in old.items():  # version 1
        lane = lane_number(key, "lane_states")
        out[str(lane)] = decode(lane, value, f"lane_states[{key!r}]", datasets)
    for key, values in runs.items():
        first = lane_number(key, "lane_runs")
        if not isinstance(values, list):
            raise StateMismatch(f"checkpoint field lane_runs[{key!r}]: not a list")
        for i, value in enumerate(values):
            out[str(first + i)] = decode(first + i, value, f"lane_runs[{key!r}][{i}]", datasets)
    return out


def _check_datasets(spec: PipelineSpec, entries: dict[str, dict[str, Any]]) -> None:
    """Every cursor of the entries counts draws of as many datasets as the source has."""
    n = len(spec.source.datasets)
    for key, entry in entries.items():
        records = [entry, entry.get("hw") or {}, *entry.get("residues", [])]
        records += [r.get("hw") for r in entry.get("residues", []) if isinstance(r, dict)]
        for record in records:
            cursor = record.get("cursor") if isinstance(record, dict) else None
            if isinstance(cursor, dict) and len(cursor.get("counts") or ()) != n:
                raise StateMismatch(
                    f"checkpoint field: lane {key}'s counts: draws of "
                    f"{len(cursor.get('counts') or ())} datasets, the source has {n}"
                )


def merge_checkpoints(states: list[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint from the checkpoints of several ranks (their lanes together)."""
    if not states:
        raise ConfigError("merge_checkpoints needs at least one checkpoint")
    merged = dict(states[0])
    for name in ("lane_states", "lane_runs"):  # versions 1 and 2
        merged.pop(name, None)
        for state in states:
            if name in state:
                merged.setdefault(name, {}).update(state[name])
    return merged


def restore(spec: PipelineSpec, state: dict[str, Any]) -> Resume:
    """Check ``state`` against ``spec`` and read this rank's lanes out of it.

    Raises:
        StateMismatch: not a checkpoint, or one of another pipeline (naming what differs).
    """
    if not isinstance(state, dict) or state.get("zephon_checkpoint") not in VERSIONS:
        raise StateMismatch("not a Zephon pipeline checkpoint")
    state = {**state, "lane_states": lane_entries(state)}
    _check_datasets(spec, state["lane_states"])
    if isinstance(state.get("lanes"), bool) or not isinstance(state.get("lanes"), int):
        raise StateMismatch(f"checkpoint field lanes: not a lane count ({state.get('lanes')!r})")
    if state["lanes"] < 1 or not isinstance(state.get("history", []), list):
        raise StateMismatch("checkpoint field lanes or history: out of range")
    ours = spec.identity()
    if state.get("on_error") != ours["on_error"]:
        raise StateMismatch(
            f"checkpoint does not match this pipeline: on_error: checkpoint has "
            f"{state.get('on_error')!r}, this pipeline has {ours['on_error']!r}"
        )
    changed = changes(spec, state)
    _check_locations(spec, state.get("locations"))
    _adopt_ratios(spec, state.get("source"))
    lane_states = state.get("lane_states", {})
    history = list(state.get("history", []))
    past = _past_source(spec, state.get("source"))
    _check_past(spec, state)
    if state.get("lanes") != spec.lanes or past is not None:
        history, residues = relane(spec, state, history, past)
        residues = {
            lane: _adapt_residues(spec, changed, rs, f"residues of lane {lane}")
            for lane, rs in residues.items()
        }
        zeros = [0] * spec.stateful_steps
        lanes = {
            lane: {
                "cursor": None,
                "delivered": 0,
                "ops": zeros,
                "state": None,
                "mark": None,
                "residues": residues[lane],
            }
            for lane in spec.my_lanes
            if lane in residues
        }
        return Resume(lanes=lanes, history=history)
    missing = [lane for lane in spec.my_lanes if str(lane) not in lane_states]
    if missing:
        raise StateMismatch(
            f"checkpoint lacks lanes {missing}, which rank {spec.rank} of {spec.world_size} "
            f"owns (it holds lanes {sorted(int(k) for k in lane_states)}): restore the "
            "checkpoints of every rank joined with Pipeline.merge_checkpoints"
        )
    resume = Resume(history=history)
    ended: set[int] = set()
    for lane in spec.my_lanes:
        entry = lane_states[str(lane)]
        resume.items[lane] = int(entry.get("items", 0))
        if entry.get("ended"):
            ended.add(lane)
        if "delivered" in entry:
            try:
                resume.lanes[lane] = _lane_resume(spec, state, lane, entry, changed)
            except (KeyError, TypeError, ValueError) as exc:  # parts the entry check leaves
                raise StateMismatch(
                    f"checkpoint field: lane {lane}'s entry: {type(exc).__name__}: {exc}"
                ) from None
    resume.ended = frozenset(ended)
    return resume


def _adapt_residues(
    spec: PipelineSpec, changes: dict[int, Operator], records: Any, where: str
) -> list[dict[str, Any]]:
    """Residue records (see :mod:`zephon.pipeline.handover`), checked, in this pipeline's
    terms."""
    if not isinstance(records, list):
        raise StateMismatch(f"checkpoint field {where}: not a list")
    out = []
    for i, record in enumerate(records):
        at = f"{where}[{i}]"
        if not isinstance(record, dict) or not isinstance(record.get("hw"), dict):
            raise StateMismatch(f"checkpoint field {at}: not a residue")
        for name in ("lanes", "generation", "lane", "delivered"):
            count(record.get(name), f"{at} {name}")
        if record["lanes"] < 1 or record["lane"] >= record["lanes"]:
            raise StateMismatch(f"checkpoint field {at} lane: outside its lanes")
        for cursor in (record.get("cursor"), record["hw"].get("cursor")):
            if cursor is not None:
                check_cursor(cursor, f"{at} cursor")
        count(record["hw"].get("delivered"), f"{at} hw delivered")
        ops = adapted(spec, changes, _ops(spec, record.get("ops"), f"{at} ops"))
        out.append({**record, "ops": list(ops)})
    return out


def _ops(spec: PipelineSpec, ops: Any, where: str) -> tuple[Any, ...]:
    """Operator states as a checkpoint stores them, checked against the chain."""
    if not isinstance(ops, list | tuple) or len(ops) != spec.stateful_steps:
        raise StateMismatch(
            f"checkpoint field {where}: {spec.stateful_steps} operator states expected"
        )
    for op, state in zip([op for op in spec.steps if op.stateful], ops, strict=True):
        try:
            op.check_state(state)
        except (ValueError, TypeError, KeyError) as exc:
            raise StateMismatch(
                f"checkpoint field {where}: {state!r:.60} is no state of {op.label()} "
                f"(it writes {exc})"
            ) from None
    return tuple(ops)


def _lane_resume(
    spec: PipelineSpec,
    state: dict[str, Any],
    lane: int,
    entry: dict[str, Any],
    changes: dict[int, Operator],
) -> dict[str, Any]:
    source = spec.source
    cursor = Cursor.from_dict(entry["cursor"]) if entry.get("cursor") else None
    lane_state = None
    history = state.get("history", [])
    hw_at = entry.get("hw") or {}
    hw_cursor = Cursor.from_dict(hw_at["cursor"]) if hw_at.get("cursor") else None
    if cursor is not None:
        lane_state = source.state(cursor, int(entry["delivered"]), spec.lanes)
        lane_state["describe"] = state["source"]  # checked by the source
        source.check_state(lane_state, spec.lanes, history, hw_cursor)
    elif state["source"] != source.describe():
        if not isinstance(state["source"], dict):
            raise StateMismatch("checkpoint was taken from a different work source")
        source.check_identity(state["source"])
    where = f"lane {lane}'s entry"
    ops = adapted(spec, changes, _ops(spec, entry.get("ops", []), f"{where} ops"))
    hw = entry.get("hw")
    if hw is not None:
        hw = (Cursor.from_dict(hw["cursor"]) if hw["cursor"] else None, int(hw["delivered"]))
    mark = new_mark(lane, cursor, int(entry["delivered"]), ops, hw)
    out = {key: entry[key] for key in _ENTRY if key in entry}
    if "residues" in out:
        out["residues"] = _adapt_residues(spec, changes, out["residues"], f"{where} residues")
    return {**out, "ops": list(ops), "state": lane_state, "mark": mark}


def _past_source(spec: PipelineSpec, theirs: Any) -> Any:
    """The work source the checkpoint's lanes were planned by, when a change to the
    curriculum's future (passes, budgets, epoch size, later phases) changed how much of a
    dataset it draws: its lanes are then cut and what is left dealt again (as when the lane
    count changes). ``None`` if the end counts are the same."""
    source = spec.source
    if not isinstance(theirs, dict):
        return None
    source.check_identity(theirs)
    ours = source.describe()
    if all(theirs.get(k) == ours.get(k) for k in FUTURE):
        return None
    past = source.variant(theirs)
    if past.ends().counts == source.ends().counts:
        return None
    source.check_ends(past.ends().counts, source.ends().counts)
    return past


def _check_past(spec: PipelineSpec, state: dict[str, Any]) -> None:
    """No lane of the checkpoint has drawn where this source's schedule differs from its."""
    source, theirs = spec.source, state.get("source")
    if not isinstance(theirs, dict) or theirs == source.describe():
        return
    history = state.get("history", [])
    for entry in state.get("lane_states", {}).values():
        if not entry.get("cursor"):
            continue
        hw = entry.get("hw") or {}
        hw_cursor = Cursor.from_dict(hw["cursor"]) if hw.get("cursor") else None
        cursor = Cursor.from_dict(entry["cursor"])
        source.check_past(
            theirs, cursor, int(entry["delivered"]), state["lanes"], history, hw_cursor
        )


def _check_locations(spec: PipelineSpec, theirs: Any) -> None:
    """The same data may have moved (its fingerprint, part of the source, says the layout,
    sizes and counts are equal); at the same root its shards must not have been rewritten."""
    if not isinstance(theirs, list):
        return  # a checkpoint without locations: the fingerprints decide alone
    ours = [d.location() for d in spec.source.datasets]
    for dataset, there, here in zip(spec.source.datasets, theirs, ours, strict=False):
        same_root = isinstance(there, dict) and there.get("root") == here["root"]
        if same_root and there.get("versions") != here["versions"]:
            raise StateMismatch(
                f"dataset {dataset.name!r} at {here['root']} changed since the checkpoint: "
                "its shards have other versions (rewritten in place)"
            )


def _adopt_ratios(spec: PipelineSpec, theirs: Any) -> None:
    """Take the checkpoint's measured tokens-per-byte ratios (frozen at its first run) for
    the datasets this source would otherwise measure."""
    source = spec.source
    missing = source.uncalibrated()
    if not missing or not isinstance(theirs, dict):
        return
    names = [name for name, _ in theirs.get("datasets", [])]
    ratios = theirs.get("tokens_per_byte")
    if names != source.names or not isinstance(ratios, list):
        return  # a different curriculum: the checks that follow say how
    source.calibrate(
        {n: r for n, r in zip(names, ratios, strict=True) if n in missing and r is not None}
    )


def merge_start(spec: PipelineSpec, received: Received) -> tuple[int, list[int]]:
    """Position (among this rank's lanes) of the lane whose turn it is, and positions of the
    lanes known to have ended: the merge restarts with the first live lane that has received
    the fewest items."""
    mine = list(spec.my_lanes)
    ended = [i for i, lane in enumerate(mine) if lane in received.ended]
    live = [i for i in range(len(mine)) if i not in ended]
    if not live:
        return 0, ended
    fewest = min(received.items.get(mine[i], 0) for i in live)
    first = next(i for i in live if received.items.get(mine[i], 0) == fewest)
    return first, ended

"""What a restore may change: a checkpoint's curriculum checked against this one (a mixin
of the work source). Everything but the future must match; the future (the mixture's phases,
passes, budgets, epoch size) may differ where no lane has drawn yet; a finite curriculum
whose end counts change is dealt again as a lane generation that records the old ones."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Self

from zephon.errors import StateMismatch
from zephon.plan.schedule import MixtureSchedule, Phase, first_difference, phases_of
from zephon.refs import Cursor

if TYPE_CHECKING:
    from zephon.plan.exhaustion import Exhaustion

__all__ = ["FUTURE", "FutureChecks"]

# What a restore may change where the checkpoint's lanes have not drawn yet
FUTURE = frozenset(
    {"weights", "schedule", "stop_after_passes", "max_samples", "max_tokens", "epoch_size"}
)


class FutureChecks:
    """The work source's checks of a checkpoint's curriculum (see the module doc)."""

    names: list[str]
    manifests: list[Any]
    phases: list[Phase]
    weights: list[Any]
    mixture: Any
    mixture_unit: str
    exhaustion: Exhaustion
    renormalize: bool
    _ends: Any

    if TYPE_CHECKING:  # the work source's own (this mixin comes first in its bases)

        def describe(self) -> dict[str, Any]: ...

        def tokens_per_sample(self) -> list[float]: ...

        def end_counts(self) -> list[int | None] | None: ...

        def _renormalizes(self) -> bool: ...

    def check_state(
        self,
        state: Mapping[str, Any],
        lanes: int,
        history: Sequence[Mapping[str, Any]] = (),
        hw: Cursor | None = None,
    ) -> tuple[Cursor, int]:
        """Validate a :meth:`state` dict for this source; returns ``(cursor, delivered)``.

        The curriculum's future (the mixture's phases, passes, budgets, epoch size) may
        differ from the checkpoint's where the lane has not drawn yet (up to its high water
        ``hw``, if its operators read ahead): a run extended, an annealing phase added.

        Raises:
            StateMismatch: it was taken from a different curriculum, or its schedule
                differs where the lane has drawn already; the message says what.
        """
        try:
            theirs = state["describe"]
            cursor = Cursor.from_dict(state["cursor"])
            delivered = int(state["delivered"])
            their_lanes = int(state["lanes"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateMismatch(f"not a work source state ({type(exc).__name__}: {exc})") from None
        if not isinstance(theirs, dict):
            raise StateMismatch(f"checkpoint field source: not a work source ({theirs!r:.60})")
        self.check_identity(theirs)
        if their_lanes != lanes:
            raise StateMismatch(
                f"checkpoint does not match this work source: lanes: checkpoint has "
                f"{their_lanes}, this run has {lanes}"
            )
        if len(cursor.counts) != len(self.manifests):
            raise StateMismatch("checkpoint cursor counts do not match the dataset list")
        self.check_past(theirs, cursor, delivered, lanes, history, hw)
        return cursor, delivered

    def check_identity(self, theirs: Mapping[str, Any]) -> None:
        """Raises ``StateMismatch`` unless a checkpoint's work source description matches
        this one in all but the future (:data:`FUTURE`), naming what differs."""
        ours = self.describe()
        diffs = [
            f"{key}: checkpoint has {theirs.get(key)!r}, this source has {ours.get(key)!r}"
            for key in sorted(set(ours) | set(theirs))
            if key not in FUTURE
            and json.dumps(theirs.get(key), sort_keys=True)
            != json.dumps(ours.get(key), sort_keys=True)
        ]
        if diffs:
            raise StateMismatch("checkpoint does not match this work source: " + "; ".join(diffs))
        if self.phases_described(theirs) is None:
            raise StateMismatch("checkpoint field source schedule: not a mixture schedule")

    def phases_described(self, theirs: Mapping[str, Any]) -> list[Phase] | None:
        """The phases of a description (its schedule, or its static weights)."""
        if "schedule" in theirs:
            phases = phases_of(theirs["schedule"])
        else:
            phases = phases_of([[0, theirs.get("weights")]])
        if phases is None or any(len(p.weights) != len(self.names) for p in phases):
            return None
        return phases

    def check_past(
        self,
        theirs: Mapping[str, Any],
        cursor: Cursor,
        delivered: int,
        lanes: int,
        history: Sequence[Mapping[str, Any]],
        hw: Cursor | None,
    ) -> None:
        """Raises ``StateMismatch`` if this source's schedule differs from the one described
        by ``theirs`` where the lane of ``cursor`` (one of ``lanes``) has drawn already."""
        old = self.phases_described(theirs)
        assert old is not None
        at = first_difference(self.phases, old)
        if at is None:
            return
        origin = self.origin(history)
        drawn = cursor.position + delivered
        if hw is not None:
            drawn = max(drawn, hw.position)
        if self.mixture_unit == "samples":
            last = origin + (drawn - 1) * lanes + cursor.lane if drawn else -1
        else:  # tokens: the lane's tokens, the delivered part of its chunk at the most
            spent = sum(cursor.tokens or ()) + delivered * max(self.tokens_per_sample())
            last = origin + spent * lanes if drawn else -1
        if last >= at:
            if len(old) == 1 and len(self.phases) == 1:
                raise StateMismatch(
                    "checkpoint does not match this work source: weights: checkpoint has "
                    f"{theirs.get('weights')!r}, this source has {self.describe()['weights']!r}"
                )
            named = self._phase_named(at)
            raise StateMismatch(
                f"the mixture schedule differs from the checkpoint's from {named} on (global "
                f"position {at}), and lane {cursor.lane} had drawn up to position {last:.0f}: a "
                "restore may change only the schedule's future"
            )

    def _phase_named(self, position: int) -> str:
        """``phase i`` of this source's schedule that holds ``position``."""
        if not isinstance(self.mixture, MixtureSchedule):
            return "phase 0"
        starts = [start for start, _ in self.mixture.phases]
        i = max(j for j, start in enumerate(starts) if start <= position)
        return f"phase {i}"

    def variant(self, theirs: Mapping[str, Any]) -> Self:
        """This work source with the future of a checkpoint's description (its phases,
        passes, budgets and epoch size): the curriculum the checkpoint was taken in."""
        self._check_future(theirs)
        other = copy.copy(self)
        phases = self.phases_described(theirs)
        if phases is None:
            raise StateMismatch("checkpoint field source schedule: not a mixture schedule")
        other.phases = phases
        other.weights = list(phases[0].weights)
        for name in ("max_samples", "max_tokens", "epoch_size"):
            setattr(other, name, theirs.get(name))
        passes = theirs.get("stop_after_passes")
        other.exhaustion = dataclasses.replace(self.exhaustion, passes=passes)
        other.renormalize = other._renormalizes()
        other._ends = None
        return other

    def _check_future(self, theirs: Mapping[str, Any]) -> None:
        """Raises ``StateMismatch`` naming a future field of a description that is not what
        a work source writes there (a corrupted checkpoint)."""

        def count(value: Any) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= 1

        passes, epoch = theirs.get("stop_after_passes"), theirs.get("epoch_size")
        bad = [] if passes is None or count(passes) else ["stop_after_passes"]
        bad += [] if epoch is None or count(epoch) else ["epoch_size"]
        for name in ("max_samples", "max_tokens"):
            caps = theirs.get(name)
            if caps is not None and not (
                isinstance(caps, list)
                and len(caps) == len(self.names)
                and all(c is None or count(c) for c in caps)
            ):
                bad.append(name)
        if bad:
            raise StateMismatch(f"checkpoint field source {bad[0]}: {theirs.get(bad[0])!r:.60}")

    def _generation_ends(self, history: Sequence[Mapping[str, Any]]) -> list[list[int | None]]:
        """Per lane generation, each dataset's end count (``None``: unbounded): the current
        ones, unless a restore changed the curriculum's future (a generation's ``ends``)."""
        ends = self.end_counts()
        now: list[int | None] = list(ends) if ends is not None else [None] * len(self.names)
        out = [now]
        for gen in reversed(history):
            theirs = gen.get("ends")
            if theirs is None:
                out.append(out[-1])
                continue
            if not isinstance(theirs, list) or len(theirs) != len(self.names):
                raise StateMismatch("checkpoint field history ends: not an end count per dataset")
            self.check_ends(theirs, out[-1])
            out.append(list(theirs))
        return out[::-1]

    def check_ends(self, theirs: Sequence[Any], ours: Sequence[int | None]) -> None:
        """Raises ``StateMismatch`` unless end counts ``theirs`` (a checkpoint's) can become
        ``ours``: counts, and bounded where ours are."""
        for d, (a, b) in enumerate(zip(theirs, ours, strict=True)):
            if a is not None and (isinstance(a, bool) or not isinstance(a, int) or a < 0):
                raise StateMismatch(f"checkpoint field history ends: {a!r} is no count")
            if (a is None) != (b is None):
                raise StateMismatch(
                    f"dataset {self.names[d]!r} is drawn {'without end' if a is None else a} "
                    f"times in the checkpoint's curriculum and "
                    f"{'without end' if b is None else b} in this one: a restore may "
                    "change how much a finite curriculum draws, not make it infinite (or "
                    "finite)"
                )

    def relane(
        self,
        lanes: int,
        history: Sequence[Mapping[str, Any]],
        cuts: Sequence[Sequence[int]],
        new_lanes: int,
        ends: Sequence[int | None] | None = None,
    ) -> list[dict[str, Any]]:
        """``history`` with one more generation: ``lanes`` lanes that had made ``cuts[lane]``
        draws of each dataset, dealt to ``new_lanes`` lanes. ``ends``: the end counts the
        old lanes were planned with, when the curriculum's future changed them."""
        if len(cuts) != lanes or any(len(c) != len(self.manifests) for c in cuts):
            raise StateMismatch(f"re-laning needs the draws of all {lanes} lanes")
        by_dataset = [[int(cuts[i][d]) for i in range(lanes)] for d in range(len(self.manifests))]
        generation: dict[str, Any] = {"from_lanes": lanes, "lanes": new_lanes, "cuts": by_dataset}
        if ends is not None:
            generation["ends"] = list(ends)
        return [*(dict(g) for g in history), generation]

    def origin(self, history: Sequence[Mapping[str, Any]] = ()) -> float:
        """Where the current lane generation starts, as a global position in the mixture's
        unit: the draws of every earlier generation's lanes at their cuts (in tokens, at the
        datasets' mean tokens per sample)."""
        if not history or len(self.phases) == 1:
            return 0
        drawn = [
            sum(int(c) for c in gen["cuts"][d]) for gen in history for d in range(len(self.names))
        ]
        if self.mixture_unit == "samples":
            return sum(drawn)
        tps = self.tokens_per_sample()
        k = len(self.names)
        return sum(c * tps[i % k] for i, c in enumerate(drawn))

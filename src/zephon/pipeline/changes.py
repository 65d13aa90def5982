"""Changes on restore: operators whose changeable settings differ from a checkpoint's.

An operator names the settings a restore may change (``Operator.changeable``: a batch size,
a pack length); the checkpoint records their values. :func:`changes` finds the operators
whose settings differ (each rebuilt as the checkpoint had it, which must then match the
checkpoint's label) and refuses a change no state could follow; :func:`adapted` restates a
lane's operator states in the new settings' terms (``Operator.adapt``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from zephon.errors import ConfigError, StateMismatch
from zephon.ops.operator import Operator
from zephon.pipeline.spec import PipelineSpec

__all__ = ["adapted", "changes"]


def changes(spec: PipelineSpec, state: dict[str, Any]) -> dict[int, Operator]:
    """The operators whose :attr:`~zephon.ops.operator.Operator.changeable` settings differ
    from the checkpoint's, each as the checkpoint had it, by step.

    Raises:
        StateMismatch: the chains differ otherwise, or a change cannot be exact.
    """
    theirs, settings = state.get("ops"), state.get("settings")
    ours = [op.identity() for op in spec.steps]
    mismatch = StateMismatch(
        f"checkpoint does not match this pipeline: ops: checkpoint has {theirs!r}, "
        f"this pipeline has {ours!r}"
    )
    if not isinstance(theirs, list) or len(theirs) != len(ours):
        raise mismatch
    changes: dict[int, Operator] = {}
    for i, (op, label) in enumerate(zip(spec.steps, theirs, strict=True)):
        if label == ours[i]:
            continue
        old = _as_checkpointed(op, settings[i] if isinstance(settings, list) else None)
        if old is None or old.identity() != label:
            raise mismatch
        changes[i] = old
    for i, old in changes.items():
        later = [op for op in spec.steps[i + 1 :] if op.stateful]
        if later:
            raise StateMismatch(
                f"the checkpoint was taken under {old.label()} and this pipeline has "
                f"{spec.steps[i].label()}: {later[0].label()} after it holds its outputs, "
                "counted in the old units, so the change cannot be exact; restore under "
                f"{old.label()}"
            )
    return changes


def _as_checkpointed(op: Operator, settings: Any) -> Operator | None:
    """``op`` with the settings a checkpoint recorded for it, if they are its kind."""
    if not op.changeable or not isinstance(settings, dict) or set(settings) != set(op.changeable):
        return None
    try:
        return dataclasses.replace(op, **settings)  # type: ignore[type-var]
    except (TypeError, ValueError, ConfigError):
        return None  # not settings this operator takes


def adapted(
    spec: PipelineSpec, changes: dict[int, Operator], ops: tuple[Any, ...]
) -> tuple[Any, ...]:
    """A lane's operator states from a checkpoint, in the terms of this pipeline's settings."""
    if not changes:
        return ops
    out = list(ops)
    depth = 0
    for i, op in enumerate(spec.steps):
        if op.stateful:
            if i in changes:
                out[depth] = op.adapt(out[depth], changes[i])
            depth += 1
    return tuple(out)

"""What a step knows of the sample it runs on beyond the sample itself: the pass.
Standard library only (imported with the package).

A dataset read more than once in a run (``stop_after_passes=N``, a repeat under
``exhausted_policy="repeat"``) gives each sample once per pass. Augmentation keyed by the
sample alone would repeat itself every pass; keyed by the sample and :func:`sample_pass` it
is fresh in every pass and still the same in any worker, at any worker count and after a
restore (the pass of a draw belongs to the curriculum, like its order).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

__all__ = ["item_passes", "sample_pass"]

PASS: ContextVar[int] = ContextVar("zephon_sample_pass", default=0)


def sample_pass() -> int:
    """The pass of its dataset in which the sample a ``map`` or ``filter`` is running on
    was drawn: 0 in the first pass, 1 in the second... (0 outside a pipeline, and for
    steps after ``batch`` or ``pack``, whose items hold several samples)."""
    return PASS.get()


def item_passes(refs: Any, offset: int, n: int) -> int | list[int]:
    """The passes of items ``offset .. offset + n`` of a block whose provenance is
    ``refs`` (columns or a list of refs): one int when they share it (the usual case: a
    chunk draws from one pass), else one per item."""
    passes = getattr(refs, "passes", None)
    if passes is not None:
        part = passes[offset : offset + n]  # an int64 column
        if not len(part) or part.min() == part.max():
            return int(part[0]) if len(part) else 0
        return list(part.tolist())
    if not isinstance(refs, list):
        return 0
    out = [r[3] if isinstance(r, tuple) and len(r) == 4 else 0 for r in refs[offset : offset + n]]
    return out[0] if out and out.count(out[0]) == len(out) else out

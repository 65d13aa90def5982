"""The planner: curricula as pure functions of dataset manifests (no I/O, no asyncio).

| module | owns |
| --- | --- |
| ``arguments`` | a work source's arguments, checked and normalised |
| ``budget`` | end counts of a scheduled or budgeted curriculum (the run as a fluid) |
| ``future`` | what a restore may change: a checkpoint's curriculum against this one |
| ``coalesce`` | From a chunk's sample pointers to range requests |
| ``exhaustion`` | when a curriculum ends: per-dataset exhaustion policies as global draw counts |
| ``lanemix`` | one lane's mixture: a schedule's phases at its positions, in segments |
| ``lanes`` | How one dataset's draws are dealt out to lanes |
| ``manifest`` | What the planner knows of a dataset: shard sizes and where samples lie |
| ``mixture`` | Exact, RNG-free interleaving of datasets by weight |
| ``order`` | The order of one dataset's samples in one pass: the four shuffle modes |
| ``planner`` | One lane's curriculum, planned chunk by chunk: mixing, locating, coalescing |
| ``report`` | the plan before the run: ``ws.report`` and ``zephon plan`` |
| ``ratios`` | tokens per byte of a token mixture or token budget: given or measured |
| ``relane`` | re-laning: a curriculum cut at a checkpoint and dealt to another number of lanes |
| ``schedule`` | mixture schedules: weights that change at global positions |
| ``runs`` | Sizes the planner derives from a manifest: block-shuffle run sizes and mean samp |
| ``worksource`` | StaticMixtureWorkSource: the curriculum as a pure function |
"""

from zephon.plan.manifest import Manifest
from zephon.plan.schedule import MixtureSchedule
from zephon.plan.worksource import StaticMixtureWorkSource, WorkChunk

__all__ = ["Manifest", "MixtureSchedule", "StaticMixtureWorkSource", "WorkChunk"]

"""The planner: curricula as pure functions of dataset manifests (no I/O, no asyncio)."""

from zephon.plan.manifest import Manifest
from zephon.plan.worksource import StaticMixtureWorkSource, WorkChunk

__all__ = ["Manifest", "StaticMixtureWorkSource", "WorkChunk"]

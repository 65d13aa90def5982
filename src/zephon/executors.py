"""Where CPU-heavy steps run: ``executor=`` of ``map``, ``filter``, ``tokenize`` and ``decode``.

- :class:`Local`: the pipeline's own process pool on this machine (what ``processes=N``
  means; ``Local(N)`` and ``processes=N`` are the same).
- :class:`Ray`: a pool of Ray actors, on this machine or a cluster. Whole blocks are shipped
  (never one task per sample), at most ``num_actors * blocks_per_actor`` blocks in flight per
  lane, results back in curriculum order; payloads travel through Ray's object store.

The placement never changes what a pipeline delivers or its checkpoints: a run checkpointed
with one executor restores with another.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from zephon.errors import ConfigError

__all__ = ["Local", "Ray"]


@dataclass(frozen=True)
class Local:
    """The pipeline's process pool: ``processes`` workers (``0``: in the event loop)."""

    processes: int = 2

    def __post_init__(self) -> None:
        if self.processes < 0:
            raise ConfigError(f"Local(processes=...) must be >= 0, got {self.processes}")


@dataclass(frozen=True)
class Ray:
    """A pool of Ray actors.

    Args:
        num_actors: actors in the pool (each a process on some node of the cluster).
        address: the cluster (``"ray://head:10001"``, ``"head:6379"``, ``"auto"``); ``None``
            uses ``RAY_ADDRESS`` if set, else an already connected Ray, else starts one here.
        num_cpus_per_actor: CPUs Ray reserves for each actor.
        runtime_env: Ray runtime environment of the actors (pip packages, env vars...).
        max_retries: times a block is run again on a fresh actor after its actor died, then
            ``WorkerCrashed``.
        blocks_per_actor: blocks in flight per actor and lane (keeps every actor busy while
            results travel).
    """

    num_actors: int = 2
    address: str | None = None
    num_cpus_per_actor: float = 1
    runtime_env: dict[str, Any] | None = field(default=None, repr=False, hash=False)
    max_retries: int = 3
    blocks_per_actor: int = 2

    def __post_init__(self) -> None:
        if self.num_actors < 1:
            raise ConfigError(f"Ray(num_actors=...) must be >= 1, got {self.num_actors}")
        if self.num_cpus_per_actor < 0 or self.max_retries < 0 or self.blocks_per_actor < 1:
            raise ConfigError(
                "Ray(...): num_cpus_per_actor and max_retries must be >= 0, blocks_per_actor >= 1"
            )

    def __repr__(self) -> str:  # the address may carry credentials; the runtime env too
        address = None if self.address is None else re.sub(r"//[^/@]*@", "//***@", self.address)
        return (
            f"Ray(num_actors={self.num_actors}, address={address!r}, "
            f"num_cpus_per_actor={self.num_cpus_per_actor})"
        )

    @property
    def inflight(self) -> int:
        """Blocks in flight per lane."""
        return self.num_actors * self.blocks_per_actor

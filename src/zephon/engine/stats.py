"""Per-stage counters: items in and out, time busy and time waiting."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["StageStats"]


@dataclass
class StageStats:
    """What one stage did. ``waiting_s`` is time spent waiting for input or for room
    downstream; ``busy_s`` is the rest of its run time."""

    name: str
    concurrency: str = "1"
    items_in: int = 0
    items_out: int = 0
    dropped: int = 0  # items a step dropped because the user asked (ensure_mixture)
    busy_s: float = 0.0
    waiting_s: float = 0.0
    started: float = 0.0
    finished: bool = False

    def start(self) -> None:
        self.started = time.perf_counter()

    def finish(self) -> None:
        total = time.perf_counter() - self.started if self.started else 0.0
        self.busy_s = max(0.0, total - self.waiting_s)
        self.finished = True

    def as_dict(self) -> dict[str, Any]:
        busy = self.busy_s
        if self.started and not self.finished:  # still running (or cancelled): so far
            busy = max(0.0, time.perf_counter() - self.started - self.waiting_s)
        return {
            "items_in": self.items_in,
            "items_out": self.items_out,
            **({"dropped": self.dropped} if self.dropped else {}),
            "busy_s": round(busy, 6),
            "waiting_s": round(self.waiting_s, 6),
            "concurrency": self.concurrency,
        }

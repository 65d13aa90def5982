"""Counters of one storage client, cheap enough to update on every request."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

__all__ = ["StorageStats"]

_LATENCY_WINDOW = 4096  # recent requests kept for percentiles: bounded memory, recent behaviour


@dataclass
class StorageStats:
    """Requests, bytes, retries, throttles and latency of one storage client."""

    requests: int = 0
    bytes_read: int = 0
    retries: int = 0
    throttles: int = 0
    truncated: int = 0
    failures: int = 0
    _latencies_s: deque[float] = field(default_factory=lambda: deque(maxlen=_LATENCY_WINDOW))

    def record(self, latency_s: float, nbytes: int) -> None:
        self.requests += 1
        self.bytes_read += nbytes
        self._latencies_s.append(latency_s)

    def percentile_s(self, q: float) -> float | None:
        """Latency percentile ``q`` in [0, 100] over the recent window, or ``None`` if empty."""
        if not self._latencies_s:
            return None
        ordered = sorted(self._latencies_s)
        index = min(len(ordered) - 1, round(q / 100.0 * (len(ordered) - 1)))
        return ordered[index]

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "bytes_read": self.bytes_read,
            "retries": self.retries,
            "throttles": self.throttles,
            "truncated": self.truncated,
            "failures": self.failures,
            "p50_latency_s": self.percentile_s(50),
            "p99_latency_s": self.percentile_s(99),
        }

"""Policies of a storage client: how it retries and how far it may run ahead."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RetryPolicy", "StorageLimits"]


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Jittered exponential backoff for transient storage failures.

    The wait before retry ``k`` (0-based) is uniform in ``[0, min(max_delay_s,
    base_delay_s * 2**k))`` ("full jitter"), which spreads a thundering herd of clients.

    Args:
        max_attempts: total attempts per operation, first one included.
        base_delay_s: backoff scale.
        max_delay_s: cap of one wait.
        attempt_timeout_s: a single attempt taking longer is abandoned and retried.
        throttle_timeout_s: throttled attempts (429, 503 SlowDown) do not count against
            ``max_attempts``; they are retried for this long after the first of them.
    """

    max_attempts: int = 10
    base_delay_s: float = 0.05
    max_delay_s: float = 5.0
    attempt_timeout_s: float = 120.0
    throttle_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.base_delay_s < 0 or self.max_delay_s < 0:
            raise ValueError("delays must be >= 0")
        if self.attempt_timeout_s <= 0:
            raise ValueError(f"attempt_timeout_s must be > 0, got {self.attempt_timeout_s}")
        if self.throttle_timeout_s < 0:
            raise ValueError(f"throttle_timeout_s must be >= 0, got {self.throttle_timeout_s}")

    def delay_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based)."""
        cap = min(self.max_delay_s, self.base_delay_s * (2**attempt))
        return random.uniform(0.0, cap)


@dataclass(frozen=True, slots=True)
class StorageLimits:
    """Bounds of one storage client.

    Args:
        max_requests: requests in flight at most (and the connection pool size).
        min_requests: the floor adaptive throttling may cut down to.
        max_inflight_bytes: bytes of reads in flight at most (a memory budget).
    """

    max_requests: int = 64
    min_requests: int = 2
    max_inflight_bytes: int = 256 * 1024 * 1024

    def __post_init__(self) -> None:
        if not 1 <= self.min_requests <= self.max_requests:
            raise ValueError(
                "need 1 <= min_requests <= max_requests, got "
                f"min_requests={self.min_requests}, max_requests={self.max_requests}"
            )
        if self.max_inflight_bytes < 1:
            raise ValueError(f"max_inflight_bytes must be >= 1, got {self.max_inflight_bytes}")

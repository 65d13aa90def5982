"""The progress bar of ``iter(progress=True)``: items, MB/s and items/s of a run."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["ProgressBar"]


class ProgressBar:
    """A tqdm bar advanced by delivered items; ``bytes_read()`` gives the run's fetched bytes
    for the MB/s figure, refreshed at most twice a second."""

    def __init__(self, started: float, bytes_read: Callable[[], int]) -> None:
        from tqdm import tqdm

        self.started = started
        self.bytes_read = bytes_read
        self.bar = tqdm(unit=" items", dynamic_ncols=True, desc="zephon")
        self.last = time.perf_counter()

    def advance(self, n: int) -> None:
        self.bar.update(n)
        now = time.perf_counter()
        if now - self.last > 0.5:
            self.last = now
            elapsed = max(1e-9, now - self.started)
            mb = self.bytes_read() / 1e6
            self.bar.set_postfix_str(f"{mb / elapsed:.1f} MB/s, {self.bar.n / elapsed:.0f} items/s")

    def close(self) -> None:
        self.bar.close()

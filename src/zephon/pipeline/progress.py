"""The progress report of ``iter(progress=True)``: batches (or samples), their rate and the
MB/s of data read (fetched, or served from what discovery's scan kept) of a run.

On a terminal it is a tqdm bar redrawn in place. Anywhere else (a log file, a cluster job's
captured stderr) ``\\r`` redraws would pile up into one endless line, so it writes one plain
line every few seconds and a last one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["ProgressBar"]

LOG_EVERY_S = 5.0  # seconds between lines when stderr is not a terminal


class ProgressBar:
    """Advanced by delivered items (``unit``: ``"batches"`` or ``"samples"``);
    ``bytes_read()`` gives the run's bytes of data read for the MB/s figure, refreshed at most
    twice a second (on a terminal)."""

    def __init__(
        self,
        started: float,
        bytes_read: Callable[[], int],
        stream: TextIO | None = None,
        unit: str = "items",
    ) -> None:
        self.started = started
        self.bytes_read = bytes_read
        self.stream = stream if stream is not None else sys.stderr
        self.unit = unit
        self.items = 0
        self.last = time.perf_counter()
        self.bar: Any = None
        if self.stream.isatty():
            from tqdm import tqdm

            self.bar = tqdm(unit=f" {unit}", dynamic_ncols=True, desc="zephon", file=self.stream)

    def _rates(self, now: float) -> str:
        elapsed = max(1e-9, now - self.started)
        mb = self.bytes_read() / 1e6
        return f"{self.items / elapsed:,.0f} {self.unit}/s, data read at {mb / elapsed:.1f} MB/s"

    def advance(self, n: int) -> None:
        self.items += n
        if self.bar is not None:
            self.bar.update(n)
        now = time.perf_counter()
        if self.bar is not None and now - self.last > 0.5:
            self.last = now
            self.bar.set_postfix_str(self._rates(now))
        elif self.bar is None and now - self.last >= LOG_EVERY_S:
            self.last = now
            self._line(now)

    def _line(self, now: float) -> None:
        elapsed = now - self.started
        print(
            f"zephon: {self.items:,} {self.unit} in {elapsed:.1f}s ({self._rates(now)})",
            file=self.stream,
            flush=True,
        )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
        else:
            self._line(time.perf_counter())

"""A lane's first chunk is planned without the chunks after it (issue 16, time to first
batch): an endless curriculum over a small dataset spans many passes per chunk, each pass a
few permutations to set up, and planning eight chunks before the first one came out held the
event loop for tens of milliseconds before the first read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from zephon.plan import Manifest, StaticMixtureWorkSource
from zephon.plan.order import DatasetOrder


@pytest.mark.parametrize("shuffle", ["none", "shards", "block", "global"])
def test_the_first_chunk_locates_only_its_own_pointers(
    shuffle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    located: list[int] = []
    original = DatasetOrder.locate

    def counting(self: DatasetOrder, pass_: int, ranks: np.ndarray) -> Any:
        located.append(len(ranks))
        return original(self, pass_, ranks)

    monkeypatch.setattr(DatasetOrder, "locate", counting)
    tiny = Manifest.uniform("tiny", 2, 20, 100)  # 40 samples: 25 passes per chunk of 1000
    ws = StaticMixtureWorkSource([tiny], shuffle=shuffle, chunk_size=1000, seed=3,
                                 stop_after_passes=None)  # fmt: skip
    chunks = ws.chunks(0, 1)
    first = next(chunks)
    assert len(first) == 1000 and sum(located) == 1000
    assert len(set(first.passes.tolist())) == 25
    second = next(chunks)  # and the plan goes on where the first chunk ended
    assert second.cursor == first.next_cursor and sum(located) >= 2000

"""Small datasets in endless curricula (issue 16, time to first batch): a lane's chunk spans
many passes of a dataset smaller than the chunk, each pass a few permutations to set up.
Planning eight such chunks before the first came out, and setting up every pass apart, held
the event loop for tens of milliseconds per chunk: a one-sample dataset took ~1 s to its
first batch of 4 (`benchmarks/revisions.py small`). The first chunk is now planned alone,
and the passes of a chunk are located together."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.property.test_planner import ragged
from zephon.plan import Manifest, StaticMixtureWorkSource
from zephon.plan.order import DatasetOrder
from zephon.plan.planner import LanePlanner


@pytest.mark.parametrize("shuffle", ["none", "shards", "block", "global"])
def test_the_first_chunk_locates_only_its_own_pointers(
    shuffle: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    located: list[int] = []
    original = LanePlanner._locate

    def counting(self: LanePlanner, d: int, first: int, n: int) -> Any:
        located.append(n)
        return original(self, d, first, n)

    monkeypatch.setattr(LanePlanner, "_locate", counting)
    tiny = Manifest.uniform("tiny", 2, 20, 100)  # 40 samples: 25 passes per chunk of 1000
    ws = StaticMixtureWorkSource(
        [tiny], shuffle=shuffle, chunk_size=1000, seed=3, stop_after_passes=None
    )
    chunks = ws.chunks(0, 1)
    first = next(chunks)
    assert len(first) == 1000 and sum(located) == 1000
    assert len(set(first.passes.tolist())) == 25
    second = next(chunks)  # and the plan goes on where the first chunk ended
    assert second.cursor == first.next_cursor and sum(located) >= 2000


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=5).filter(lambda s: sum(s) > 0),
    st.sampled_from(["none", "shards", "block", "global"]),
    st.sampled_from([1, 2, 4, 64]),
    st.integers(1, 9),
    st.integers(0, 2**32),
    st.booleans(),
)
def test_many_passes_at_once_are_located_as_pass_by_pass(
    sizes: list[int], shuffle: str, run: int, count: int, seed: int, wide: bool
) -> None:
    """The same (shard, sample) for every rank of every pass as :meth:`locate` pass by pass,
    for datasets smaller than a window (the fast path) and not (``wide``: the loop)."""
    n = sum(sizes)
    order = DatasetOrder(
        ragged("d", sizes, 0),
        shuffle,
        seed % 1000,
        block_size=n,
        window=max(1, n // 2) if wide else n + 1 + seed % 50,
        run_size=run,
    )
    rng = np.random.default_rng(seed)
    passes = sorted(rng.choice(10_000, size=count, replace=False).tolist())
    which = rng.integers(0, count, size=3 * n)
    ranks = rng.integers(0, n, size=3 * n)
    shards, samples = order.locate_passes(passes, which, ranks)
    for i, pass_ in enumerate(passes):
        mask = which == i
        want = order.locate(pass_, ranks[mask])
        assert shards[mask].tolist() == want[0].tolist()
        assert samples[mask].tolist() == want[1].tolist()

"""Loader metrics in TensorBoard (``zephon.torch.LoaderMetrics``): written every N steps by a
real ``SummaryWriter`` and read back with TensorBoard's own event reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource

pytest.importorskip("torch")
pytest.importorskip("tensorboard")
pytestmark = pytest.mark.integration


def test_loader_metrics_are_written_every_n_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from zephon.torch import LoaderMetrics

    ds = Dataset.from_records("t", [{"i": i, "text": "x" * (i % 50)} for i in range(4000)])
    pipe = Pipeline(StaticMixtureWorkSource([ds]), lanes=2).batch(10)
    metrics = LoaderMetrics(pipe, log_dir=str(tmp_path), every=25)
    steps = 0
    for step, _ in enumerate(pipe):
        metrics.step(step)
        steps += 1
    metrics.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {
        "loader/steps_per_s",
        "loader/wait_share",
        "loader/read_MBps",
        "loader/requests",
    } <= tags
    assert any(t.startswith("loader/busy/fetch") for t in tags)
    written = events.Scalars("loader/steps_per_s")
    assert [e.step for e in written] == [s for s in range(steps) if (s + 1) % 25 == 0]
    assert all(e.value > 0 for e in written), [e.value for e in written]
    assert all(0 <= e.value <= 1.01 for e in events.Scalars("loader/wait_share"))
    assert events.Scalars("loader/requests")[-1].value > 0
    with pytest.raises(ValueError, match="every must be >= 1"):
        LoaderMetrics(pipe, log_dir=str(tmp_path), every=0)

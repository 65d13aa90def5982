"""A checkpoint is what the trainer consumed: taken after step ``k`` with any loader, the
restored run's first batch is batch ``k + 1`` of the uninterrupted run, whatever sat in the
prefetch queues (the pipeline's, a DataLoader's workers' and pin-memory thread's, the
process engine's shared-memory slots). Ray actors: ``tests/integration/test_ray.py``."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from tests.formatdata import write_jsonl  # noqa: E402
from zephon import Dataset, Pipeline, StaticMixtureWorkSource  # noqa: E402

pytestmark = pytest.mark.integration
K = 7  # steps before the checkpoint


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("consumed") / "web"
    write_jsonl(path, shards=4, per_shard=60)
    return str(path)


def build(root: str, lanes: int = 4, **kwargs: Any) -> Pipeline:
    ws = StaticMixtureWorkSource([Dataset.from_path("web", root)], seed=5, shuffle="global")
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=lanes, **kwargs)
    return pipe.tokenize("bytes").shuffle(50, warmup=4).pack(24).batch(3)


def rows(batches: list[Any]) -> list[list[tuple[int, ...]]]:
    return [[tuple(r) for r in b["input_ids"].tolist()] for b in batches]


def _stateful(workers: int, convert: bool) -> Callable[[str, Any], tuple[list[Any], Any]]:
    """A StatefulDataLoader with ``workers`` workers, prefetch and pin memory; its state
    either as it is or joined into one pipeline checkpoint and back (``convert``)."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from zephon.torch import loader_checkpoint, loader_state

    def run(root: str, state: Any) -> tuple[list[Any], Any]:
        extra = {"prefetch_factor": 4, "multiprocessing_context": "forkserver"} if workers else {}
        loader = StatefulDataLoader(
            build(root).to_torch_dataset(),
            batch_size=None,
            num_workers=workers,
            pin_memory=True,
            **extra,
        )
        if state is not None:
            loader.load_state_dict(loader_state(state, workers, 0, 1) if convert else state)
        got = []
        for batch in loader:
            got.append(batch)
            if state is None and len(got) == K:
                saved = loader.state_dict()
                return got, json.loads(json.dumps(loader_checkpoint(saved) if convert else saved))
        return got, None

    return run


def _plain_dataloader(root: str, state: Any) -> tuple[list[Any], Any]:
    """A plain DataLoader reading in the trainer's process: the dataset's own state."""
    from torch.utils.data import DataLoader

    dataset = build(root).to_torch_dataset()
    if state is not None:
        dataset.load_state_dict(state)
    got = []
    for batch in DataLoader(dataset, batch_size=None, pin_memory=True):
        got.append(batch)
        if state is None and len(got) == K:
            return got, json.loads(json.dumps(dataset.state_dict()))
    return got, None


def _pipeline(**kwargs: Any) -> Callable[[str, Any], tuple[list[Any], Any]]:
    def run(root: str, state: Any) -> tuple[list[Any], Any]:
        pipe = build(root, **kwargs)
        if state is not None:
            pipe.restore(state)
        got = []
        for batch in pipe:
            got.append(batch)
            if state is None and len(got) == K:
                return got, json.loads(json.dumps(pipe.checkpoint()))
        return got, None

    return run


def _async(root: str, state: Any) -> tuple[list[Any], Any]:
    async def go() -> tuple[list[Any], Any]:
        pipe = build(root, prefetch=16)
        if state is not None:
            pipe.restore(state)
        got = []
        async for batch in pipe:
            got.append(batch)
            if state is None and len(got) == K:
                return got, json.loads(json.dumps(pipe.checkpoint()))
        return got, None

    return asyncio.run(go())


LOADERS = {
    "stateful-dataloader-2-workers": _stateful(2, convert=False),
    "stateful-dataloader-2-workers-joined": _stateful(2, convert=True),
    "stateful-dataloader-in-process": _stateful(0, convert=False),
    "stateful-dataloader-in-process-joined": _stateful(0, convert=True),
    "plain-dataloader-in-process": _plain_dataloader,
    "for-loop-deep-prefetch": _pipeline(prefetch=16),
    "process-engine": _pipeline(engine="process"),
    "async-for": _async,
}


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
@pytest.mark.parametrize("loader", list(LOADERS))
def test_a_checkpoint_after_step_k_resumes_at_batch_k_plus_one(root: str, loader: str) -> None:
    run = LOADERS[loader]
    head, state = run(root, None)
    rest, _ = run(root, state)
    full, _ = _everything(root, loader)
    assert len(head) == K
    assert rows(head) + rows(rest) == full


def _everything(root: str, loader: str) -> tuple[list[Any], None]:
    """The uninterrupted run, as the loader orders it (DataLoader workers interleave their
    lanes a batch at a time)."""
    if "2-workers" in loader:
        from torchdata.stateful_dataloader import StatefulDataLoader

        mp = {"num_workers": 2, "multiprocessing_context": "forkserver"}
        return rows(
            list(StatefulDataLoader(build(root).to_torch_dataset(), batch_size=None, **mp))
        ), None
    return rows(list(build(root))), None

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
            loader.load_state_dict(loader_state(state, workers, build(root)) if convert else state)
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


@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")
@pytest.mark.parametrize("given", [True, False])
def test_a_worker_that_has_not_yielded_since_a_restore_gives_its_own_lanes(
    root: str, given: bool
) -> None:
    """Restored with 3 workers and checkpointed after 2 batches, one worker has yielded
    nothing: its state was the whole checkpoint loaded, and joined after the others' it put
    back the lanes they had moved on from (the chaos harness found 864 rows repeated). With
    the pipeline given to loader_state, each worker's state is its own lanes; without, the
    loaded state is joined first."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from zephon.torch import loader_checkpoint, loader_state

    mp = {"num_workers": 3, "multiprocessing_context": "forkserver"}

    def loader(state: Any = None) -> Any:
        out = StatefulDataLoader(build(root, lanes=6).to_torch_dataset(), batch_size=None, **mp)
        if state is not None:
            out.load_state_dict(loader_state(state, 3, build(root, lanes=6) if given else None))
        return out

    full = sorted(r for b in rows(list(build(root, lanes=6))) for r in b)
    first = loader()
    seen = rows(_take(first, 11))  # workers gave 4, 4, 3: the 3rd and 1st are next
    state = loader_checkpoint(first.state_dict())
    second = loader(state)
    seen += rows(_take(second, 2))
    state = loader_checkpoint(second.state_dict())
    seen += rows(list(loader(state)))
    assert sorted(r for b in seen for r in b) == full


def _take(loader: Any, n: int) -> list[Any]:
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == n:
            break
    return got

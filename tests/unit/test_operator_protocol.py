"""The operator interface is the whole seam: an operator written outside Zephon's pipeline
package (here, in this test) runs, shows in ``explain()``, and resumes exactly from a
checkpoint, with no other change. A built-in stateful operator is its module plus the
builder verb that constructs it."""

from __future__ import annotations

import ast
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.ops.block import Block
from zephon.ops.marks import with_state
from zephon.ops.operator import LaneContext, StreamOperator

SRC = Path(__file__).parents[2] / "src" / "zephon"


@dataclass(frozen=True)
class EveryKth(StreamOperator):
    """Keeps the k-th, 2k-th... item of each lane: its state is how many it has seen."""

    name: ClassVar[str] = "every_kth"
    stateful: ClassVar[bool] = True

    k: int

    def label(self) -> str:
        return f"every_kth({self.k})"

    async def run(self, blocks: AsyncIterator[Block], lane: LaneContext) -> AsyncIterator[Block]:
        seen = int(lane.resume[1]) if lane.resume is not None else 0
        async for block in blocks:
            items, refs, marks = [], [], []
            for i, item in enumerate(block.items):
                seen += 1
                if seen % self.k == 0:
                    items.append(item)
                    refs.append(block.refs[i])
                    marks.append(with_state(block.mark(i), seen, None))
            if items:
                yield Block(lane.lane, items, refs, marks, block.nbytes)


def _pipe(root: Path) -> Pipeline:
    ds = Dataset.from_path("nums", str(root), index_cache=False)
    ws = StaticMixtureWorkSource([ds], seed=5, chunk_size=16, stop_after_passes=1)
    pipe = Pipeline(ws, rank=0, world_size=1, lanes=2).shuffle(32, warmup=0)
    return pipe._with(EveryKth(3)).batch(2)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for s in range(3):
        rows = [json.dumps({"i": s * 100 + i}) for i in range(70)]
        (tmp_path / f"part-{s}.jsonl").write_text("\n".join(rows) + "\n")
    return tmp_path


def test_an_operator_from_outside_runs_explains_and_resumes_exactly(root: Path) -> None:
    pipe = _pipe(root)
    assert "-> every_kth(3)" in pipe.explain()
    whole = [b["i"].tolist() for b in pipe]
    assert sum(len(b) for b in whole) == 70  # every third of each lane's 105
    for cut in (1, 7, len(whole) - 2):
        first = _pipe(root)
        it = iter(first)
        head = [next(it)["i"].tolist() for _ in range(cut)]
        state = json.loads(json.dumps(first.checkpoint()))
        it.close()
        again = _pipe(root)
        again.restore(state)
        assert head + [b["i"].tolist() for b in again] == whole, cut


def _stage_code() -> list[Path]:
    return [SRC / "pipeline" / name for name in ("steps.py", "graph.py", "spec.py", "run.py")]


def test_the_stages_never_ask_which_operator_they_run() -> None:
    """No stage switches on an operator's name or class: a new operator needs no case."""
    from zephon.ops import batch, group, mixture, objects, pack, shuffle, transform

    concrete = {
        cls.__name__
        for module in (batch, group, mixture, objects, pack, shuffle, transform)
        for cls in vars(module).values()
        if isinstance(cls, type) and issubclass(cls, StreamOperator) and cls is not StreamOperator
    }
    assert {"Shuffle", "Batch", "BatchPerDataset", "EnsureMixture", "Packing"} <= concrete
    for path in _stage_code():
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        assert not names & concrete, f"{path.name} names {names & concrete}"
        assert "kind" not in names, f"{path.name} switches on a kind"

"""``import zephon`` is cheap: a worker process importing one operator module does not load
the storage clients, Parquet or the pipeline (the workers' start-up pays for what it imports,
on the CPU the first batch needs)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import zephon


def test_an_operator_module_imports_without_the_rest_of_zephon() -> None:
    heavy = [
        "zephon.pipeline",
        "zephon.dataset",
        "zephon.storage.s3",
        "aiohttp",
        "aiobotocore",
        "pyarrow",
    ]
    code = (
        f"import sys, zephon.ops.image; print([m for m in {heavy!r} if m in sys.modules]);"
        "import zephon; print(zephon.pipeline.Pipeline.__name__)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]", "Pipeline"]  # and subpackages load on first use


def test_import_zephon_loads_neither_numpy_nor_asyncio() -> None:
    """``python -c "import zephon"`` loads the errors and value types only: numpy and asyncio
    (about 0.1 s of a fresh interpreter between them) wait for the first dataset or pipeline."""
    code = "import sys, zephon; print([m for m in ('numpy', 'asyncio') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["[]"]


def test_the_public_names_resolve_on_first_use() -> None:
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.dataset import Dataset as DatasetClass
    from zephon.pipeline import Pipeline as PipelineClass
    from zephon.plan import StaticMixtureWorkSource as Source

    assert (Dataset, Pipeline, StaticMixtureWorkSource) == (DatasetClass, PipelineClass, Source)
    assert set(zephon.__all__) <= set(dir(zephon))
    for name in zephon.__all__:
        assert getattr(zephon, name) is not None
    assert zephon.plan.StaticMixtureWorkSource is Source  # subpackages, as before
    assert zephon.pipeline.Pipeline is PipelineClass
    with pytest.raises(AttributeError, match="no attribute 'Datasets'"):
        _ = zephon.Datasets  # type: ignore[attr-defined]


def test_a_pipeline_without_rank_does_not_import_torch() -> None:
    """Its rank comes from torch.distributed only where the script imported torch (a process
    group needs it), else from RANK/WORLD_SIZE: importing torch to ask cost 3-6 s."""
    code = (
        "import os, sys\n"
        "from zephon import Dataset, Pipeline, StaticMixtureWorkSource\n"
        "ds = Dataset.from_records('a', [{'id': i} for i in range(10)], samples_per_shard=5)\n"
        "pipe = Pipeline(StaticMixtureWorkSource([ds]))\n"
        "print(len(list(pipe)), pipe.spec.rank, pipe.spec.world_size, 'torch' in sys.modules)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["10", "0", "1", "False"]
    env = {**env, "RANK": "1", "WORLD_SIZE": "2"}
    ranked = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert ranked.stdout.split()[1:] == ["1", "2", "False"]

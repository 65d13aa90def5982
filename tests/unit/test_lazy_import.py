"""``import zephon`` is cheap: a worker process importing one operator module does not load
the storage clients, Parquet or the pipeline (the workers' start-up pays for what it imports,
on the CPU the first batch needs)."""

from __future__ import annotations

import subprocess
import sys

import pytest

import zephon


def test_an_operator_module_imports_without_the_rest_of_zephon() -> None:
    heavy = ["zephon.pipeline", "zephon.dataset", "zephon.storage.s3", "aiohttp", "aiobotocore",
             "pyarrow"]  # fmt: skip
    code = (f"import sys, zephon.ops.image; print([m for m in {heavy!r} if m in sys.modules]);"
            "import zephon; print(zephon.pipeline.Pipeline.__name__)")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)  # fmt: skip
    assert out.stdout.split() == ["[]", "Pipeline"]  # and subpackages load on first use


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

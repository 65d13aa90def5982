"""``zephon.testing.local_s3``: examples that read ``s3://bucket/...`` run as printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zephon import Dataset, Pipeline, StaticMixtureWorkSource
from zephon.errors import Unreachable
from zephon.testing import local_s3

pytestmark = pytest.mark.integration


def test_local_s3_holds_the_files_and_the_uploaded_folder(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "part-0.jsonl").write_text(
        "".join(json.dumps({"i": i}) + "\n" for i in range(5))
    )
    files = {"web/part-0.jsonl": '{"i": 10}\n{"i": 11}\n', "web/part-1.jsonl": b'{"i": 12}\n'}
    with local_s3("bucket", files, upload=tmp_path, prefix="data/") as options:
        web = Dataset.from_path("web", "s3://bucket/web/", storage_options=options)
        code = Dataset.from_path("code", "s3://bucket/data/code/", storage_options=options)
        ws = StaticMixtureWorkSource([web, code])
        assert sorted(x["i"] for x in Pipeline(ws)) == [0, 1, 2, 3, 4, 10, 11, 12]
        assert "secret" in options and options["endpoint_url"].startswith("http://127.0.0.1:")
    with pytest.raises(Unreachable):  # the server is gone with the block
        Dataset.from_path("web", "s3://bucket/web/", storage_options=options)

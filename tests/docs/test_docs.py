"""The documentation runs: every Python block of the README and of docs/ is executed, page
by page as one script (as a user would paste it), against a real local S3 server holding the
data the pages name. A block that shows another library's code starts with ``# before`` and
is not run (that library is not installed here). The site builds with ``--strict``, every
error class is explained in Troubleshooting and every public name has a docstring."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from zephon.testing import S3Endpoint

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FIXTURES = ROOT / "tests" / "fixtures" / "data"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def blocks(page: Path) -> list[str]:
    return [b for b in BLOCK.findall(page.read_text()) if not b.startswith("# before")]


@pytest.fixture(scope="module")
def workdir(s3_endpoint: S3Endpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with ``tokenizer.json``, and ``s3://bucket/`` holding the examples' data
    (see :mod:`zephon.testing.examples`): pages that call ``serve_examples()`` start their
    own server with the same data, as a reader's script does."""
    from zephon.testing.examples import fill_examples

    root = tmp_path_factory.mktemp("docs")
    fill_examples(s3_endpoint.client(), "bucket", root)
    return root


@pytest.fixture(scope="module")
def env(s3_endpoint: S3Endpoint) -> Iterator[dict[str, str]]:
    out = {
        **os.environ,
        "AWS_ENDPOINT_URL": s3_endpoint.endpoint_url,
        "AWS_ACCESS_KEY_ID": s3_endpoint.key,
        "AWS_SECRET_ACCESS_KEY": s3_endpoint.secret,
        "AWS_DEFAULT_REGION": s3_endpoint.region_name,
    }
    out.pop("RAY_ADDRESS", None)
    yield out


@pytest.mark.parametrize("page", [p for p in PAGES if blocks(p)], ids=lambda p: p.name)
def test_every_python_block_runs(page: Path, workdir: Path, env: dict[str, str]) -> None:
    script = workdir / f"{page.stem}.py"
    script.write_text("\n\n".join(blocks(page)))
    command = [sys.executable, "-W", "error::DeprecationWarning", str(script)]
    done = subprocess.run(
        command, cwd=workdir, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{page}:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    # the API reference lists every public method, those of the Pipeline's mixins included
    import zephon

    page = (tmp_path / "site" / "reference" / "index.html").read_text()
    for cls in (zephon.Pipeline, zephon.Dataset, zephon.StaticMixtureWorkSource):
        public = [n for n in dir(cls) if not n.startswith("_")]
        missing = [n for n in public if f"zephon.{cls.__name__}.{n}" not in page]
        assert missing == [], f"{cls.__name__}: {missing}"


def test_troubleshooting_explains_every_error() -> None:
    import zephon.errors as errors

    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    names = [
        n
        for n, c in vars(errors).items()
        if inspect.isclass(c) and issubclass(c, errors.ZephonError)
    ]
    assert len(names) >= 13
    assert [n for n in names if f"`{n}`" not in text] == []


HISTORY = re.compile(
    r"\bsession \d|\b(?:this|last|earlier|previous|next|same|first|second|third|\w+th) "
    r"session\b|\bissue #?\d|\bphase \d|\bphase (?:one|two|three)\b",
    re.I,
)


def test_user_pages_do_not_speak_of_the_projects_history() -> None:
    """Users have the repository, not its history: no sessions, issues or project phases in
    the README and the docs (history belongs in git)."""
    found = [
        f"{page.relative_to(ROOT)}:{n}: {line.strip()[:80]}"
        for page in PAGES
        for n, line in enumerate(page.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert found == []


def test_the_benchmarks_page_shows_current_results_briefly() -> None:
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= 460  # nineteen benchmarks, each its command and output
    assert text.count("```bash") >= 10  # every result with its command


def test_links_stay_in_the_repository() -> None:
    for page in PAGES:
        for target in re.findall(r"\]\(([^)]+)\)", page.read_text()):
            if target.startswith(("http://", "https://", "#")):
                continue
            path = (page.parent / target.split("#")[0]).resolve()
            assert path.is_relative_to(ROOT) and path.exists(), f"{page.name}: {target}"


@pytest.mark.parametrize(
    "module", ["zephon", "zephon.executors", "zephon.errors", "zephon.storage", "zephon.torch"]
)
def test_every_public_name_has_a_docstring(module: str) -> None:
    mod = importlib.import_module(module)
    missing = []
    for name in getattr(mod, "__all__", []):
        obj = getattr(mod, name)
        if (inspect.isclass(obj) or inspect.isfunction(obj)) and not inspect.getdoc(obj):
            missing.append(name)
        if inspect.isclass(obj) and obj.__module__.startswith("zephon"):
            missing += [
                f"{name}.{m}"
                for m, f in vars(obj).items()
                if not m.startswith("_")
                and (inspect.isfunction(f) or isinstance(f, property))
                and not inspect.getdoc(f)
            ]
    assert missing == []

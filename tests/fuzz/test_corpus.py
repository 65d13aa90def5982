"""The fuzz corpus in the suite: every input of every target (seeds, inputs that reached new
code, inputs that once crashed a target) parses or raises what its parser documents; a short
coverage-guided run of each target; and the JPEG binding built with AddressSanitizer and
UndefinedBehaviorSanitizer over the JPEG corpus."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.fuzz import corpus
from tests.fuzz.targets import TARGETS

ROOT = Path(__file__).parents[2]

RUN_CORPUS = """
import sys
from tests.fuzz import corpus
from tests.fuzz.targets import TARGETS
target = sys.argv[1]
for path in corpus.files(target):
    try:
        TARGETS[target](path.read_bytes())
    except BaseException:
        print("input", path.name, file=sys.stderr)
        raise
print(len(corpus.files(target)))
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("target", list(TARGETS))
def test_every_corpus_input_parses_or_raises_what_its_parser_documents(target: str) -> None:
    """In a child process: a native crash (pyarrow, libjpeg) is reported, not the end of
    the test run."""
    assert corpus.files(target), f"no corpus for {target}: run python -m tests.fuzz.corpus"
    run = subprocess.run(
        [sys.executable, "-c", RUN_CORPUS, target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert int(run.stdout.split()[-1]) == len(corpus.files(target))


@pytest.mark.timeout(600)
def test_a_short_seeded_coverage_guided_run_of_every_target_finds_nothing() -> None:
    pytest.importorskip("atheris")
    run = subprocess.run(
        [sys.executable, "-m", "tests.fuzz.run", "all", "--runs", "20000", "--seed", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert run.stdout.count("inputs in") == len(TARGETS)


SANITIZED_RUN = """
import importlib.machinery, importlib.util, sys
spec = importlib.util.spec_from_file_location(
    "zephon._jpeg", sys.argv[1],
    loader=importlib.machinery.ExtensionFileLoader("zephon._jpeg", sys.argv[1]))
binding = importlib.util.module_from_spec(spec)
spec.loader.exec_module(binding)
sys.modules["zephon._jpeg"] = binding   # what zephon.ops.jpeg loads
from zephon.ops import jpeg
assert jpeg._BINDING is binding, "the sanitized build is not the one in use"
from tests.fuzz import corpus
from tests.fuzz.targets import jpeg as target
for path in corpus.files("jpeg"):
    target(path.read_bytes())
print("ran", len(corpus.files("jpeg")))
"""


@pytest.mark.timeout(300)
@pytest.mark.skipif(sys.platform != "linux", reason="gcc's sanitizers on Linux")
def test_the_jpeg_binding_under_address_and_undefined_behaviour_sanitizers(
    tmp_path: Path,
) -> None:
    gcc = shutil.which("gcc")
    if gcc is None or importlib.util.find_spec("zephon._jpeg") is None:
        pytest.skip("needs gcc and libjpeg-turbo's headers (the binding is built)")
    asan = subprocess.run(
        [gcc, "-print-file-name=libasan.so"], capture_output=True, text=True
    ).stdout.strip()
    if not Path(asan).is_file():
        pytest.skip("gcc has no AddressSanitizer runtime here")
    module = tmp_path / f"_jpeg{sysconfig.get_config_var('EXT_SUFFIX')}"
    include = sysconfig.get_paths()["include"]
    build = subprocess.run(
        [
            gcc,
            "-shared",
            "-fPIC",
            "-O1",
            "-g",
            "-fno-omit-frame-pointer",
            "-fsanitize=address,undefined",
            "-fno-sanitize-recover=undefined",
            f"-I{include}",
            str(ROOT / "src/zephon/_jpeg.c"),
            "-ljpeg",
            "-o",
            str(module),
        ],
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    env = {
        **os.environ,
        "LD_PRELOAD": asan,
        "PYTHONPATH": str(ROOT),
        # Python's own allocations are not ours to judge; leaks at exit neither.
        "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1",
        "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1",
        "PYTHONMALLOC": "malloc",
    }
    run = subprocess.run(
        [sys.executable, "-c", SANITIZED_RUN, str(module)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=280,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    assert run.stdout.strip() == f"ran {len(corpus.files('jpeg'))}"

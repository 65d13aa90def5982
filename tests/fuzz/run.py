"""Coverage-guided fuzzing of one target (:mod:`tests.fuzz.targets`) with atheris (libFuzzer).

Zephon's own modules are instrumented; the run starts from the target's corpus, keeps inputs
that reach new code in a working folder (``--keep`` adds them to the corpus), and stops at the
first crash (an exception the target does not allow, a native crash, a timeout), writing the
input as ``crash-*``, and adding it to the corpus so the suite runs it from then on.

    .venv/bin/python -m tests.fuzz.run TARGET [--seconds 60] [--keep]
    .venv/bin/python -m tests.fuzz.run all --seconds 300     # each target in turn
    .venv/bin/python -m tests.fuzz.run all --runs 20000 --seed 1   # the same inputs every time

A run bounded by time explores differently on every machine and every run; the suite runs a
fixed number of inputs from a fixed seed, so that what it finds, it finds on every machine.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.fuzz import corpus

ROOT = Path(__file__).parents[2]


def fuzz(target: str, seconds: int, keep: bool, runs: int | None = None, seed: int = 0) -> int:
    """Fuzz ``target`` for ``seconds`` (or ``runs`` inputs from ``seed``) in a child process;
    its exit code (0: nothing found)."""
    bound = [f"-runs={runs}", f"-seed={seed}"] if runs else [f"-max_total_time={seconds}"]
    with tempfile.TemporaryDirectory() as work:
        found = Path(work) / "found"
        found.mkdir()
        argv = [
            sys.executable,
            "-m",
            "tests.fuzz.run",
            "--child",
            target,
            *bound,
            "-timeout=10",
            "-rss_limit_mb=3072",
            f"-artifact_prefix={work}/",
            "-print_final_stats=1",
            str(found),
            str(corpus.CORPUS / target),
        ]
        started = time.monotonic()
        run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
        stats = [line for line in run.stderr.splitlines() if line.startswith("stat::")]
        execs = next(
            (line.split(":")[-1].strip() for line in stats if "number_of_executed" in line), "?"
        )
        crashes = sorted(Path(work).glob("crash-*")) + sorted(Path(work).glob("timeout-*"))
        for crash in crashes:
            kept = corpus.add(target, crash.read_bytes(), prefix="crash")
            print(f"{target}: FOUND {crash.name} -> {kept.relative_to(ROOT)}")
        if keep:
            for path in found.iterdir():
                corpus.add(target, path.read_bytes(), prefix="found")
        took = time.monotonic() - started
        print(
            f"{target}: {execs} inputs in {took:.0f} s, {len(list(found.iterdir()))} new "
            f"inputs reached new code, exit {run.returncode}"
        )
        if run.returncode and not crashes:
            print(run.stderr[-3000:])
        return run.returncode


def child(target: str, libfuzzer_args: list[str]) -> None:
    import atheris

    with atheris.instrument_imports(include=["zephon"]):
        from tests.fuzz.targets import TARGETS

    fn = TARGETS[target]
    atheris.Setup([sys.argv[0], *libfuzzer_args], fn)
    atheris.Fuzz()


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3:])
        return
    from tests.fuzz.targets import TARGETS

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("target", choices=[*TARGETS, "all"])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--runs", type=int, help="stop after this many inputs, not --seconds")
    parser.add_argument("--seed", type=int, default=0, help="libFuzzer's seed (0: random)")
    parser.add_argument("--keep", action="store_true", help="add new inputs to the corpus")
    args = parser.parse_args()
    names = list(TARGETS) if args.target == "all" else [args.target]
    failed = [t for t in names if fuzz(t, args.seconds, args.keep, args.runs, args.seed) != 0]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()

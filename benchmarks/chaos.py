"""Chaos harness: random pipelines killed and resumed under random changes, audited.

Each trial draws a configuration from ``(seed, trial)``: 1-6 JSONL datasets on local disk
(tiny ones of 1-50 samples, uneven ones, shards of 1-64 samples), a mixture (proportional or
random weights, or a schedule of 2-3 phases; ``repeat``, ``stop`` or ``drop``, 1-2 passes, a
budget or an epoch size), a shuffle mode, and a chain: samples
(optionally ``tokenize``, a ``shuffle`` step, ``batch``) or documents (optionally a
``shuffle``, ``pack`` with a random length and algorithm, optionally ``batch``). It then runs
the consumer in a child process for every segment: all ranks of a random world size (1-8),
each through a random loader (a ``for`` loop, ``async for``, or a torch ``StatefulDataLoader``
with 0-3 workers and a random ``prefetch_factor``) on a random engine, checkpointing every
few steps. The harness SIGKILLs the child's process group at a random step, restores the last
checkpoint every rank had reached under a new world size, lane count, worker count, batch
size, pack length and engine, and repeats; the last segment runs to the end.

The audit compares what the trainer consumed (each rank's batches up to the checkpoint it
resumed from) with an uninterrupted run of the first configuration: every sample (every
token, when packed) exactly as often as planned, and, where nothing but the engine and the
loader changed, the very same order on every rank. Failures print a one-line command that
reproduces them.

    python benchmarks/chaos.py --trials 1000 --seed 7
    python benchmarks/chaos.py --seconds 60            # as many as fit, a fresh seed
    python benchmarks/chaos.py --seed 7 --only 412 -v  # one trial again, saying what it does
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import itertools
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

SHUFFLES = ("none", "shards", "block", "global")
PACKS = ("concat", "first_fit", "best_fit", "best_fit_wrap")
STALL = 120  # seconds without a step: a hang
KEY = 64  # a token is document * KEY + position (documents are at most 40 tokens)


def draw(seed: int, trial: int) -> dict[str, Any]:
    """Trial ``trial``'s configuration: the data, the curriculum, the chain and the segments."""
    rng = random.Random(f"chaos:{seed}:{trial}")
    sizes = [
        rng.randint(1, 50) if rng.random() < 0.4 else rng.randint(51, 300)
        for _ in range(rng.randint(1, 6))
    ]
    packed = rng.random() < 0.5
    mixture = None
    if len(sizes) > 1 and rng.random() < 0.4:
        mixture = [round(rng.uniform(0.1, 3.0), 2) for _ in sizes]
    chain = {
        "tokenize": not packed and rng.random() < 0.4,
        "shuffle": rng.choice([None, None, 1, 5, 40, 200]),
        "warmup": rng.choice([0, 0, 4]),
        "pack": rng.choice(PACKS) if packed else None,
        "window": rng.choice([3, 16, 64]),
        "batch": (not packed) or rng.random() < 0.5,
    }
    same = rng.random() < 0.3  # only the engine and the loader change: order is audited too
    segments = []
    for s in range(rng.randint(2, 4)):
        if same and s:
            segment = dict(segments[0])
        else:
            world = rng.choice([1, 1, 2, 2, 3, 4, 5, 8])
            workers = rng.choice([0, 0, 0, 1, 2, 3]) if world <= 3 else 0
            segment = {
                "world": world,
                "workers": workers,
                "lanes": world * max(1, workers) * rng.choice([1, 1, 2]),
                "batch": rng.choice([1, 2, 3, 8, 16]),
                "seq_len": rng.choice([8, 16, 33, 64]),
                "window": rng.choice([3, 16, 64]),
            }
        segment["loader"] = (
            "dataloader" if segment["workers"] else rng.choice(["for", "async", "dataloader"])
        )
        segment["prefetch"] = rng.choice([1, 2, 4])
        segment["engine"] = (
            "process" if not segment["workers"] and rng.random() < 0.15 else "thread"
        )
        segment["every"] = rng.choice([1, 2, 3, 5])
        segment["kill"] = round(rng.uniform(0.02, 0.8), 3)  # of the steps it has left
        segments.append(segment)
    # drawn last, so the fields above are what they were before schedules and budgets
    names = [f"d{d}" for d in range(len(sizes))]
    schedule = None
    if len(sizes) > 1 and rng.random() < 0.3:
        starts = sorted(rng.sample(range(1, 2 * sum(sizes)), rng.randint(1, 2)))
        schedule = [[0, {n: rng.randint(1, 4) for n in names}]]
        for start in starts:
            chosen = rng.sample(names, rng.randint(1, len(names)))
            schedule.append([start, {n: rng.randint(1, 4) for n in chosen}])
    budget = rng.choice([None, None, None, "max_samples", "epoch", "drop"])
    budgets: dict[str, Any] = {}
    if budget == "max_samples":
        budgets["max_samples"] = {names[-1]: rng.randint(1, 2 * sizes[-1])}
    elif budget == "epoch":
        budgets["epoch_size"] = rng.randint(1, 2 * sum(sizes))
    elif budget == "drop":
        budgets["exhausted_policy"] = "drop"
    return {
        "seed": seed,
        "trial": trial,
        "sizes": sizes,
        "schedule": schedule,
        "budgets": budgets,
        "per_shard": rng.choice([1, 7, 16, 64]),
        "mixture": mixture,
        "policy": rng.choice(["repeat", "stop"]),
        "passes": rng.choice([1, 1, 2]),
        "shuffle_mode": rng.choice(SHUFFLES),
        "chunk": rng.choice([None, 4, 16]),
        "chain": chain,
        "same": same,
        "segments": segments,
    }


def write_data(config: dict[str, Any], root: Path) -> None:
    """The datasets as JSONL shards: sample ``i`` of dataset ``d`` has key ``g`` (unique over
    all datasets); documents of ``g % 40 + 1`` tokens ``g * KEY + position``."""
    g = 0
    for d, size in enumerate(config["sizes"]):
        folder = root / f"d{d}"
        folder.mkdir(parents=True)
        per = config["per_shard"]
        for s in range(0, size, per):
            lines = []
            for _ in range(s, min(size, s + per)):
                ids = [g * KEY + p for p in range(g % 40 + 1)]
                lines.append(json.dumps({"k": g, "text": f"sample {g}", "input_ids": ids}))
                g += 1
            (folder / f"part-{s:05d}.jsonl").write_text("\n".join(lines) + "\n")


def build(config: dict[str, Any], root: Path, segment: dict[str, Any], rank: int) -> Any:
    """The pipeline of ``rank`` in ``segment``."""
    from zephon import Dataset, MixtureSchedule, Pipeline, StaticMixtureWorkSource

    datasets = [
        Dataset.from_path(f"d{d}", str(root / f"d{d}"), format="jsonl")
        for d in range(len(config["sizes"]))
    ]
    mixture: Any = None
    if config["mixture"]:
        mixture = {f"d{d}": w for d, w in enumerate(config["mixture"])}
    if config.get("schedule"):
        mixture = MixtureSchedule([(start, weights) for start, weights in config["schedule"]])
    budgets = dict(config.get("budgets") or {})
    source = StaticMixtureWorkSource(
        datasets,
        mixture,
        seed=config["seed"] + config["trial"],
        shuffle=config["shuffle_mode"],
        chunk_size=config["chunk"],
        exhausted_policy=budgets.pop("exhausted_policy", config["policy"]),
        stop_after_passes=config["passes"],
        **budgets,
    )
    pipe = Pipeline(
        source,
        rank=rank,
        world_size=segment["world"],
        lanes=segment["lanes"],
        engine=segment["engine"],
    )
    chain = config["chain"]
    if chain["tokenize"]:
        pipe = pipe.tokenize("bytes")
    if chain["shuffle"]:
        pipe = pipe.shuffle(chain["shuffle"], seed=3, warmup=chain["warmup"])
    if chain["pack"]:
        pipe = pipe.pack_sequences(segment["seq_len"], chain["pack"], window=segment["window"])
    if chain["batch"]:
        pipe = pipe.batch(segment["batch"])
    return pipe


def keys(item: Any) -> list[Any]:
    """What an item holds: sample keys, or ``[document, position]`` of every real token."""
    rows = item if isinstance(item, list) else [item]
    out: list[Any] = []
    for row in rows:
        if "segment_ids" in row:
            ids, seg, pos = (_ints(row[k]) for k in ("input_ids", "segment_ids", "positions"))
            for sample_ids, sample_seg, sample_pos in _rows(ids, seg, pos):
                for t, s, p in zip(sample_ids, sample_seg, sample_pos, strict=True):
                    if s:
                        out.append([t // KEY, t % KEY] if t % KEY == p else ["bad position", t, p])
        else:
            k = row["k"]
            out += _ints(k) if not isinstance(k, int) else [k]
    return out


def _ints(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def _rows(ids: Any, seg: Any, pos: Any) -> list[Any]:
    """Rows of a packed item: one row, or a batch of them."""
    if ids and isinstance(ids[0], list):
        return list(zip(ids, seg, pos, strict=True))
    return [(ids, seg, pos)]


# -- the child: one segment, every rank at once ---------------------------------------------


def child(job_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    config, segment, out = job["config"], job["segment"], Path(job["out"])
    root, state = Path(job["root"]), job["state"]
    lock = threading.Lock()
    errors: list[str] = []

    def start(rank: int) -> Any:
        """The rank's steps, its first taken: DataLoader workers fork here, in the main
        thread, before any rank runs on a thread of its own (forking a process whose other
        threads may hold locks is unsafe; a trainer has one loader per process anyway)."""
        steps = consume(build(config, root, segment, rank), segment, state)
        return itertools.chain([next(steps)], steps)

    def run(rank: int, steps: Any) -> None:
        try:
            steps = steps if steps is not None else start(rank)
            log = open(out / f"r{rank}.log", "w")  # noqa: SIM115 (closed below)
            with log:
                for step, item, checkpoint in steps:
                    if item is None:  # the end: the final checkpoint
                        save(out / f"r{rank}-end.json", {"step": step, "state": checkpoint})
                        with lock:
                            print("end", rank, flush=True)
                        break
                    log.write(json.dumps([step, keys(item)]) + "\n")
                    log.flush()
                    if checkpoint is not None:
                        save(out / f"r{rank}-{step:06d}.json", {"step": step, "state": checkpoint})
                    with lock:
                        print("step", rank, step, flush=True)
                    if step == job["kill_at"]:  # the kill comes once every rank is here
                        threading.Event().wait()
        except BaseException as exc:  # reported to the parent, which fails the trial
            with lock:
                errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")

    ranks = range(segment["world"])
    try:
        first = [start(r) for r in ranks] if segment["loader"] == "dataloader" else None
    except BaseException as exc:
        print("error", json.dumps([f"{type(exc).__name__}: {exc}"]), flush=True)
        sys.exit(1)
    threads = [threading.Thread(target=run, args=(r, first[r] if first else None)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        print("error", json.dumps(errors), flush=True)
        sys.exit(1)


def save(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def consume(pipe: Any, segment: dict[str, Any], state: Any) -> Any:
    """``(step, item, checkpoint or None)`` for each item the trainer takes, then
    ``(steps, None, the final checkpoint)``."""
    every, step = segment["every"], 0
    if segment["loader"] == "dataloader":
        from torchdata.stateful_dataloader import StatefulDataLoader

        from zephon.torch import loader_checkpoint, loader_state

        workers = segment["workers"]
        # fork: the workers start from the main thread before the ranks' threads (child())
        extra = {"prefetch_factor": segment["prefetch"], "multiprocessing_context": "fork"}
        extra = extra if workers else {}
        loader = StatefulDataLoader(
            pipe.to_torch_dataset(), batch_size=None, num_workers=workers, **extra
        )
        if state is not None:
            loader.load_state_dict(loader_state(state, workers, pipe))
        for item in loader:
            step += 1
            cut = loader_checkpoint(loader.state_dict()) if step % every == 0 else None
            yield step, item, cut
        yield step, None, loader_checkpoint(loader.state_dict())
        return
    if state is not None:
        pipe.restore(state)
    items = pipe.iter() if segment["loader"] == "for" else _async_items(pipe)
    for item in items:
        step += 1
        yield step, item, pipe.checkpoint() if step % every == 0 else None
    yield step, None, pipe.checkpoint()


def _async_items(pipe: Any) -> Any:
    """The pipeline consumed with ``async for`` on a loop of this thread, item by item."""
    loop = asyncio.new_event_loop()
    it = pipe.__aiter__()
    try:
        while True:
            try:
                yield loop.run_until_complete(it.__anext__())
            except StopAsyncIteration:
                return
    finally:
        loop.run_until_complete(it.aclose()) if hasattr(it, "aclose") else None
        loop.close()


# -- the parent: segments, kills and the audit ----------------------------------------------


class Failure(Exception):
    pass


def reference(config: dict[str, Any], root: Path) -> tuple[dict[int, list[Any]], int]:
    """Each rank's keys in an uninterrupted run of the first segment's configuration, and
    its steps (all ranks)."""
    first = {**config["segments"][0], "engine": "thread"}
    out, steps = {}, 0
    for rank in range(first["world"]):
        items = _loader_order(build(config, root, first, rank), first["workers"])
        out[rank] = [k for item in items for k in keys(item)]
        steps += len(items)
    return out, steps


def _loader_order(pipe: Any, workers: int) -> list[Any]:
    """The rank's items in the order a ``DataLoader`` with ``workers`` workers yields them:
    worker ``w`` reads its share of the lanes, the loader takes one item of each in turn."""
    if workers <= 1:
        return list(pipe.iter())
    shares = [
        iter(list(pipe.for_rank(pipe.rank * workers + w, pipe.world_size * workers).iter()))
        for w in range(workers)
    ]
    out: list[Any] = []
    while shares:
        for share in list(shares):
            item = next(share, None)
            if item is None:
                shares.remove(share)
            else:
                out.append(item)
    return out


def _without(config: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in config.items() if k != key}


def run_segment(
    config: dict[str, Any], root: Path, s: int, state: Any, left: float, log: Any
) -> Path:
    """Segment ``s`` in a child process, killed unless it is the last at its ``kill``
    fraction of the steps it has ``left`` (about): each rank stops after that step, and the
    SIGKILL comes once all have (their prefetching still running), so a trial's cuts are the
    same on every run. Returns the folder of its logs and checkpoints."""
    segment = config["segments"][s]
    kill_at = max(1, round(segment["kill"] * left / segment["world"]))  # steps of each rank
    last = s == len(config["segments"]) - 1
    out = root / f"segment{s}"
    out.mkdir()
    job = out / "job.json"
    job.write_text(
        json.dumps(
            {
                "config": config,
                "segment": segment,
                "out": str(out),
                "root": str(root),
                "state": state,
                "kill_at": None if last else kill_at,
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(job)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own process group: the kill takes its workers too
    )
    steps = dict.fromkeys(range(segment["world"]), 0)
    killed, error = False, ""
    hung = threading.Event()
    watchdog = threading.Timer(STALL, lambda: hung.set() or _kill(proc))
    watchdog.start()
    assert proc.stdout is not None
    for line in proc.stdout:
        watchdog.cancel()
        watchdog = threading.Timer(STALL, lambda: hung.set() or _kill(proc))
        watchdog.start()
        word, *rest = line.split()
        if word == "error":
            error = line
        elif word == "step":
            steps[int(rest[0])] += 1
        elif word == "end":
            steps.pop(int(rest[0]))
        if not last and steps and min(steps.values()) >= kill_at:
            _kill(proc)
            killed = True
            break
    watchdog.cancel()
    _, stderr = proc.communicate()
    if hung.is_set():
        raise Failure(f"segment {s}: no step for {STALL} s (a hang); steps {steps}")
    how = f"killed at step {kill_at} of every live rank" if killed else "ran to the end"
    log(f"  segment {s}: {segment}: {how}")
    if not killed and proc.returncode:
        raise Failure(f"segment {s} failed: {error.strip() or stderr.strip()[-2000:]}")
    return out


def _kill(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child and everything it started (DataLoader workers, the engine's)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def resume_point(out: Path, world: int) -> tuple[dict[int, int], dict[int, Any], bool]:
    """Per rank, the step the trainer resumes after and that step's checkpoint, and whether
    every rank had ended: the last checkpoint every live rank had reached."""
    saved: dict[int, dict[int, Any]] = {}
    ended: dict[int, dict[str, Any]] = {}
    for rank in range(world):
        saved[rank] = {}
        for path in out.glob(f"r{rank}-*.json"):
            data = json.loads(path.read_text())
            if path.stem.endswith("-end"):
                ended[rank] = data
            else:
                saved[rank][data["step"]] = data["state"]
    live = [r for r in range(world) if r not in ended]
    if not live:
        return (
            {r: e["step"] for r, e in ended.items()},
            {r: e["state"] for r, e in ended.items()},
            True,
        )
    k = min(max(saved[r], default=0) for r in live)
    steps, states = {}, {}
    for rank in range(world):
        if rank in ended and ended[rank]["step"] <= k:
            steps[rank], states[rank] = ended[rank]["step"], ended[rank]["state"]
        elif k:
            steps[rank], states[rank] = k, saved[rank][k]
        else:
            steps[rank] = 0
    return steps, states, False


def consumed(out: Path, steps: dict[int, int]) -> dict[int, list[Any]]:
    """Each rank's keys of the steps up to its resume point."""
    got: dict[int, list[Any]] = {}
    for rank, upto in steps.items():
        got[rank] = []
        path = out / f"r{rank}.log"
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            try:
                step, item_keys = json.loads(line)
            except ValueError:
                break  # the line the kill cut short (its step is past every checkpoint)
            if step <= upto:
                got[rank] += item_keys
    return got


def run_trial(config: dict[str, Any], verbose: bool = False) -> None:
    """One trial (see the module doc). Raises ``Failure`` saying what the audit found."""
    log = print if verbose else (lambda *_: None)
    root = Path(tempfile.mkdtemp(prefix="zephon-chaos-"))
    try:
        write_data(config, root)
        log(f"trial {config['trial']}: {json.dumps(_without(config, 'segments'))}")
        want, steps0 = reference(config, root)
        total = sum(map(len, want.values()))
        got: dict[int, list[Any]] = collections.defaultdict(list)
        state, done = None, False
        for s in range(len(config["segments"])):
            segment = config["segments"][s]
            share = 1 - sum(map(len, got.values())) / max(1, total)
            scale = (
                config["segments"][0]["batch"] / segment["batch"] if config["chain"]["batch"] else 1
            )
            out = run_segment(config, root, s, state, steps0 * share * scale, log)
            steps, states, done = resume_point(out, config["segments"][s]["world"])
            if len(states) < len(steps):
                log(f"  no checkpoint on every rank: segment {s} is lost work")
                continue
            for rank, keys_ in consumed(out, steps).items():
                got[rank] += keys_
            from zephon import Pipeline

            state = Pipeline.merge_checkpoints(list(states.values()))
            if done:
                break
        if not done:
            raise Failure("the last segment did not end every rank")
        audit(config, want, got)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def audit(config: dict[str, Any], want: dict[int, list[Any]], got: dict[int, list[Any]]) -> None:
    flat_want = [json.dumps(k) for ks in want.values() for k in ks]
    flat_got = [json.dumps(k) for ks in got.values() for k in ks]
    bad = [k for k in flat_got if "bad position" in k]
    if bad:
        raise Failure(f"tokens at the wrong position: {bad[:3]}")
    lost = collections.Counter(flat_want) - collections.Counter(flat_got)
    extra = collections.Counter(flat_got) - collections.Counter(flat_want)
    if lost or extra:
        raise Failure(
            f"{sum(lost.values())} lost (e.g. {list(lost)[:3]}), {sum(extra.values())} repeated "
            f"or unplanned (e.g. {list(extra)[:3]}) of {len(flat_want)}"
        )
    if config["same"]:
        for rank, keys_ in want.items():
            if got.get(rank, []) != keys_:
                at = next(
                    (i for i, (a, b) in enumerate(zip(keys_, got[rank], strict=False)) if a != b),
                    None,
                )
                raise Failure(f"rank {rank}: the order changed (first difference at item {at})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: a fresh one, printed")
    parser.add_argument(
        "--seconds", type=float, default=None, help="stop starting trials after this"
    )
    parser.add_argument("--only", type=int, default=None, help="run this trial alone")
    parser.add_argument("--first", type=int, default=0, help="the first trial's number")
    parser.add_argument("--jobs", type=int, default=2, help="trials at once")
    parser.add_argument("-v", "--verbose", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args.child)
    seed = args.seed if args.seed is not None else secrets.randbelow(10**6)
    # a range, not a list: with --seconds it is practically endless (a list of 10**9 numbers
    # took 24 GB before the first trial)
    count = args.trials if args.seconds is None else 10**9
    trials = (
        range(args.only, args.only + 1)
        if args.only is not None
        else range(args.first, args.first + count)
    )
    what = f"{args.seconds:.0f} s of trials" if args.seconds else f"trials {trials[0]}-{trials[-1]}"
    print(
        f"chaos: seed {seed}, {f'trial {args.only}' if args.only is not None else what}", flush=True
    )
    start, lock = time.monotonic(), threading.Lock()
    failures: list[tuple[int, str]] = []
    ran = 0

    def worker() -> None:
        nonlocal ran, trials
        while True:
            with lock:
                if not trials or (
                    args.seconds is not None and time.monotonic() - start > args.seconds
                ):
                    return
                trial, trials = trials[0], trials[1:]
            try:
                run_trial(draw(seed, trial), args.verbose)
            except Exception as exc:  # a failed audit, or the harness itself: both fail the run
                with lock:
                    failures.append((trial, str(exc)))
                    again = f"python benchmarks/chaos.py --seed {seed} --only {trial} -v"
                    what = str(exc) if isinstance(exc, Failure) else f"{type(exc).__name__}: {exc}"
                    print(f"FAIL trial {trial}: {what}\n  reproduce: {again}", flush=True)
            with lock:
                ran += 1

    pool = [threading.Thread(target=worker) for _ in range(max(1, args.jobs))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    took = time.monotonic() - start
    print(f"chaos: seed {seed}: {ran} trials, {len(failures)} failures, {took:.0f} s")
    sys.exit(1 if failures or not ran else 0)


if __name__ == "__main__":
    main()

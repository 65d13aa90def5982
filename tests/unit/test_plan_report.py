"""The plan before the run (``ws.report`` and ``zephon plan``): its figures are what a real
run delivers, exactly: samples per dataset, per phase and per pass, first and last
positions, and the reads it makes."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from zephon import ConfigError, Dataset, MixtureSchedule, Pipeline, StaticMixtureWorkSource
from zephon.cli import main
from zephon.plan.report import read_amplification

SIZES = {"web": 300, "code": 120, "math": 45}


def datasets() -> list[Dataset]:
    return [
        Dataset.from_records(
            n,
            [{"k": f"{n}:{i}", "text": "x" * (i % 50)} for i in range(size)],
            samples_per_shard=25,
        )
        for n, size in SIZES.items()
    ]


def run(
    ws: StaticMixtureWorkSource, lanes: int, limit: int | None = None
) -> tuple[list[list[str]], dict[str, Any]]:
    """Each lane's keys, read by a rank of its own (so lane positions are known), and the
    fetch stats added up (without the range cache, which serves repeated reads from memory)."""
    out, requests, nbytes = [], 0, 0
    for lane in range(lanes):
        pipe = Pipeline(ws, rank=lane, world_size=lanes, lanes=lanes, range_cache_bytes=0)
        keys = []
        for item in pipe:
            keys.append(item["k"])
            if limit is not None and len(keys) >= limit:
                break
        out.append(keys)
        requests += pipe.stats()["fetch"]["requests"]
        nbytes += pipe.stats()["fetch"]["bytes"]
    return out, {"requests": requests, "bytes": nbytes}


SCHEDULE = MixtureSchedule(
    [(0, {"web": 1, "code": 1}), (200, {"web": 3, "code": 1}), (400, {"web": 1, "math": 2})]
)


@pytest.mark.parametrize("lanes", [1, 3])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"mixture": SCHEDULE},
        {"mixture": SCHEDULE, "max_samples": {"web": 250}, "exhausted_policy": "drop"},
        {"mixture": None, "epoch_size": 700},
    ],
)
def test_the_report_is_what_a_real_run_delivers(lanes: int, kwargs: dict[str, Any]) -> None:
    ws = StaticMixtureWorkSource(datasets(), seed=2, chunk_size=8, **kwargs)
    report = ws.report(lanes)
    streams, stats = run(ws, lanes)
    delivered = Counter(k.split(":")[0] for s in streams for k in s)
    assert {d.name: d.samples for d in report.datasets} == {n: delivered[n] for n in SIZES}
    assert report.samples == sum(map(len, streams))
    # the storage reads and bytes (a pipeline's range cache, off here, may serve repeats)
    assert (report.requests, report.bytes) == (stats["requests"], stats["bytes"])
    # per phase: a lane's position p is global position p * lanes + lane
    starts = report.phases
    for d in report.datasets:
        per_phase = [0] * len(starts)
        for lane, keys in enumerate(streams):
            for p, key in enumerate(keys):
                if key.startswith(d.name + ":"):
                    g = p * lanes + lane
                    per_phase[max(i for i, s in enumerate(starts) if s <= g)] += 1
        assert d.per_phase == per_phase
        positions = [
            p * lanes + lane
            for lane, keys in enumerate(streams)
            for p, k in enumerate(keys)
            if k.startswith(d.name + ":")
        ]
        if positions:
            assert (d.first, d.last) == (min(positions), max(positions))
        # passes: a sample drawn the j-th time is in pass j
        seen = Counter(k for s in streams for k in s if k.startswith(d.name + ":"))
        assert d.passes == max(seen.values(), default=0)


def test_an_endless_run_is_planned_to_a_bound() -> None:
    ws = StaticMixtureWorkSource(datasets(), SCHEDULE, stop_after_passes=None, chunk_size=8)
    with pytest.raises(ConfigError, match="samples=N"):
        ws.report(2)
    report = ws.report(2, samples=1001)
    assert report.samples == 1001
    streams, _ = run(ws, 2, limit=501)
    delivered = Counter(
        k.split(":")[0] for s in streams for k in s[: 501 if not streams.index(s) else 500]
    )
    assert {d.name: d.samples for d in report.datasets} == {n: delivered[n] for n in SIZES}


def test_tokens_per_dataset_and_phase() -> None:
    ws = StaticMixtureWorkSource(
        datasets(),
        SCHEDULE,
        chunk_size=8,
        tokens_per_byte=0.5,
        mixture_unit="samples",
        max_tokens={"math": 10**9},
    )
    report = ws.report(2)
    for d in report.datasets:
        assert d.tokens is not None and d.per_phase_tokens is not None
        assert sum(d.per_phase_tokens) == pytest.approx(d.tokens)
        assert (d.tokens > 0) == (d.samples > 0)


def test_the_cost_and_the_plot(tmp_path: Path) -> None:
    ws = StaticMixtureWorkSource(datasets(), SCHEDULE, chunk_size=8)
    report = ws.report(2, get_price_per_1000=1.0, egress_price_per_gib=2**30 / 1e6)
    assert report.cost == pytest.approx(report.requests / 1000 + report.bytes / 1e6)
    path = report.plot(str(tmp_path / "plan.png"))
    assert Path(path).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "math" in report.text() and json.loads(report.to_json())["samples"] == report.samples


def test_zephon_plan_from_a_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for name, size in SIZES.items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "part-0.jsonl").write_text(
            "".join(json.dumps({"k": f"{name}:{i}"}) + "\n" for i in range(size))
        )
    config = tmp_path / "plan.toml"
    config.write_text(
        "\n".join(
            [
                *(f'[[datasets]]\nname = "{n}"\npath = "{tmp_path / n}"\n' for n in SIZES),
                "[schedule]",
                "phases = [",
                "  { position = 0, weights = { web = 1, code = 1 } },",
                "  { position = 200, weights = { web = 1, math = 2 } },",
                "]",
                "[source]",
                "stop_after_passes = 1",
                "chunk_size = 8",
            ]
        )
    )
    assert (
        main(["plan", str(config), "--lanes", "2", "--json", "--plot", str(tmp_path / "p.png")])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    ws = StaticMixtureWorkSource(
        [Dataset.from_path(n, str(tmp_path / n)) for n in SIZES],
        MixtureSchedule([(0, {"web": 1, "code": 1}), (200, {"web": 1, "math": 2})]),
        chunk_size=8,
    )
    assert [d["samples"] for d in out["datasets"]] == [d.samples for d in ws.report(2).datasets]
    assert (tmp_path / "p.png").exists()
    bad = tmp_path / "bad.toml"
    bad.write_text('[[datasets]]\nname = "web"\n')
    assert main(["plan", str(bad)]) == 2
    assert "needs a name and a path" in capsys.readouterr().err


def test_explain_estimates_read_amplification_and_warns_above_one_and_a_half(
    tmp_path: Path,
) -> None:
    for s in range(4):
        rows = "".join(json.dumps({"i": s * 2000 + i, "t": "x" * 1500}) + "\n" for i in range(2000))
        (tmp_path / f"p{s}.jsonl").write_text(rows)
    ds = Dataset.from_path("w", str(tmp_path))
    dense = Pipeline(StaticMixtureWorkSource([ds], shuffle="none"), lanes=2).explain()
    assert "reads: about 1.00x the samples' bytes" in dense and "warning" not in dense
    spread = Pipeline(StaticMixtureWorkSource([ds], shuffle="global"), lanes=2).explain()
    assert 1.0 <= _amplification(spread) <= 1.3 and "warning" not in spread  # a global shuffle
    holes = Pipeline(StaticMixtureWorkSource([ds.exclude(range(0, 8000, 2))]), lanes=2).explain()
    assert _amplification(holes) > 1.5  # every other record: the holes are read through
    assert "warning: the plan reads" in holes and "coalesce_gap_bytes" in holes


def _amplification(explained: str) -> float:
    line = next(x for x in explained.splitlines() if x.startswith("reads: about"))
    return float(line.split("about ")[1].split("x")[0])


def test_the_read_estimate_counts_what_the_range_cache_keeps(tmp_path: Path) -> None:
    """Consecutive chunks that draw from one Parquet row group each read all of it; the
    range cache fetches it once, and so does the estimate ``explain()`` prints (no warning
    for a plan whose reads the cache absorbs); a cache too small to keep anything, or none,
    counts every read."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "code").mkdir()
    (tmp_path / "web").mkdir()
    for s in range(2):
        rows = pa.table({"i": range(s * 2000, s * 2000 + 2000), "t": ["y" * 1500] * 2000})
        pq.write_table(rows, tmp_path / "code" / f"p{s}.parquet", row_group_size=500)
        lines = "".join(
            json.dumps({"i": s * 2000 + i, "t": "x" * 1500}) + "\n" for i in range(2000)
        )
        (tmp_path / "web" / f"p{s}.jsonl").write_text(lines)
    datasets = [Dataset.from_path(n, str(tmp_path / n)) for n in ("code", "web")]
    ws = StaticMixtureWorkSource(datasets, shuffle="block", chunk_size=64, seed=1)
    bare = read_amplification(ws, 2)
    cached = read_amplification(ws, 2, cache_bytes=64 << 20)
    assert bare is not None and cached is not None
    assert bare > 1.5 and cached < 1.3 and read_amplification(ws, 2, cache_bytes=1) == bare
    explained = Pipeline(ws, lanes=2).explain()  # its range cache on, as by default
    assert _amplification(explained) < 1.3 and "warning" not in explained
    assert "warning: the plan reads" in Pipeline(ws, lanes=2, range_cache_bytes=0).explain()


def test_lanes_sharing_the_range_cache_are_estimated_as_they_fetch(tmp_path: Path) -> None:
    """Two lanes drawing chunks from the same Parquet row groups each read a group whole; the
    pipeline's one range cache serves the second lane's read of it. Estimated lane by lane,
    that plan read 2x its data; the estimate now takes the lanes in turn through one cache,
    and agrees with what the pipeline fetches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    for s in range(2):
        rows = pa.table({"i": range(s * 4000, s * 4000 + 4000), "t": ["y" * 1500] * 4000})
        pq.write_table(rows, tmp_path / f"p{s}.parquet", row_group_size=1000)
    ds = Dataset.from_path("code", str(tmp_path))
    ws = StaticMixtureWorkSource([ds], shuffle="block", chunk_size=250, seed=3, stop_after_passes=1)
    pipe = Pipeline(ws, lanes=2)
    explained = pipe.explain()
    estimate = _amplification(explained)
    assert sum(1 for _ in pipe) == 8000
    groups = sum(int(index.group_nbytes.sum()) for index in ds.indexes)
    fetched = pipe.stats()["fetch"]["bytes"] / groups
    assert fetched < 1.1 and abs(estimate - fetched) < 0.15 and "warning" not in explained

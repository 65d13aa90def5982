"""Bad input gets a typed error naming the dataset, the shard and, where known, the sample."""

from __future__ import annotations

import asyncio
import gzip
import io
import json
import shutil
import tarfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.formatdata import FIXTURES, reference, to_jsonable, write_jsonl, write_parquet
from zephon.cli import main
from zephon.dataset import Dataset
from zephon.errors import ConfigError, FormatError, NotFound, ObjectChanged
from zephon.testing import S3Endpoint

pytestmark = pytest.mark.integration


def test_missing_local_path(tmp_path: Path) -> None:
    with pytest.raises(NotFound) as info:
        Dataset.from_path("web", str(tmp_path / "nope"))
    assert "nope" in str(info.value) and "'web'" in str(info.value)


def test_missing_bucket(s3_endpoint: S3Endpoint) -> None:
    with pytest.raises(NotFound) as info:
        Dataset.from_path(
            "web", "s3://zephon-no-such-bucket/x/", storage_options=s3_endpoint.storage_options()
        )
    assert "zephon-no-such-bucket" in str(info.value) and info.value.dataset == "web"


def test_unknown_and_mixed_formats(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y\n")
    with pytest.raises(FormatError, match="unknown format"):
        Dataset.from_path("d", str(tmp_path))
    write_jsonl(tmp_path, shards=1)
    write_parquet(tmp_path, shards=1)
    with pytest.raises(FormatError, match="mixed formats") as info:
        Dataset.from_path("d", str(tmp_path))
    assert info.value.dataset == "d"
    assert Dataset.from_path("d", str(tmp_path), format="parquet").num_samples == 250
    with pytest.raises(ConfigError, match="format must be one of"):
        Dataset.from_path("d", str(tmp_path), format="csv")


def test_line_that_is_not_json_names_the_sample(tmp_path: Path) -> None:
    (tmp_path / "s.jsonl").write_text('{"a": 1}\n{"a": 2}\n{"a": 3\n{"a": 4}\n')
    ds = Dataset.from_path("web", str(tmp_path))
    with pytest.raises(FormatError) as info:
        ds.head(4)
    err = info.value
    assert (err.dataset, err.sample) == ("web", 2) and err.uri is not None
    assert err.uri.endswith("s.jsonl") and "not valid JSON" in str(err)
    (tmp_path / "s.jsonl").write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(FormatError, match="not an object"):
        Dataset.from_path("web", str(tmp_path)).head(2)


@pytest.mark.parametrize("text_bytes", [40, 40_000])  # row groups of ~5 KB and ~2.5 MB
def test_corrupt_row_group_names_its_first_sample(tmp_path: Path, text_bytes: int) -> None:
    rows = [{"id": i, "text": f"{i:08d}" * (text_bytes // 8)} for i in range(192)]
    pq.write_table(
        pa.Table.from_pylist(rows), tmp_path / "t.parquet", row_group_size=64, compression="none"
    )
    column = pq.ParquetFile(tmp_path / "t.parquet").metadata.row_group(1).column(1)
    start = column.dictionary_page_offset or column.data_page_offset
    data = bytearray((tmp_path / "t.parquet").read_bytes())
    data[start : start + 16] = b"\x07" * 16  # the chunk's first page header
    (tmp_path / "t.parquet").write_bytes(bytes(data))
    ds = Dataset.from_path("tab", str(tmp_path))

    async def read(samples: list[int]) -> list[Any]:
        async with ds.open_storage() as storage:
            return await ds.aread(storage, 0, samples)

    assert asyncio.run(read([0, 63, 128])) == [rows[0], rows[63], rows[128]]  # others decode
    with pytest.raises(FormatError) as info:
        asyncio.run(read([70]))
    assert (info.value.dataset, info.value.sample) == ("tab", 64)
    assert info.value.uri is not None and info.value.uri.endswith("t.parquet")


def test_corrupt_parquet_footer(tmp_path: Path) -> None:
    write_parquet(tmp_path, shards=2)
    data = (tmp_path / "shard-01.parquet").read_bytes()
    (tmp_path / "shard-01.parquet").write_bytes(data[:-40] + b"\xff" * 36 + data[-4:])
    with pytest.raises(FormatError) as info:
        Dataset.from_path("tab", str(tmp_path))
    assert info.value.uri is not None and info.value.uri.endswith("shard-01.parquet")
    (tmp_path / "shard-01.parquet").write_bytes(data[: len(data) // 2])  # truncated
    with pytest.raises(FormatError, match="PAR1"):
        Dataset.from_path("tab", str(tmp_path))


def test_truncated_mds_shard_and_corrupt_index(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "mds", tmp_path / "mds")
    shard = tmp_path / "mds" / "shard.00003.mds"
    shard.write_bytes(shard.read_bytes()[:1000])
    with pytest.raises(FormatError, match="past its end") as info:
        Dataset.from_path("m", str(tmp_path / "mds"))
    assert info.value.uri is not None and info.value.uri.endswith("shard.00003.mds")
    (tmp_path / "mds" / "index.json").write_text('{"version": 2, "shards": [{"format": "mds"}]}')
    with pytest.raises(FormatError, match="index"):
        Dataset.from_path("m", str(tmp_path / "mds"))


def test_truncated_tar(tmp_path: Path) -> None:
    import io

    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for i in range(5):
            info = tarfile.TarInfo(f"k{i}.bin")
            info.size = 3000
            tar.addfile(info, io.BytesIO(b"x" * 3000))
    data = (tmp_path / "a.tar").read_bytes()
    (tmp_path / "a.tar").write_bytes(data[:5000])
    with pytest.raises(FormatError, match="corrupt tar"):
        Dataset.from_path("w", str(tmp_path))


def test_truncated_gzip(tmp_path: Path) -> None:
    data = gzip.compress(b"".join(b'{"i": %d}\n' % i for i in range(1000)))
    (tmp_path / "a.jsonl.gz").write_bytes(data[: len(data) - 30])
    with pytest.raises(FormatError, match="truncated gzip"):
        Dataset.from_path("z", str(tmp_path))


def test_pickle_is_refused_unless_allowed() -> None:
    with pytest.raises(FormatError, match="allow_pickle"):
        Dataset.from_path("p", str(FIXTURES / "mds-pickle"))
    ds = Dataset.from_path("p", str(FIXTURES / "mds-pickle"), allow_pickle=True)
    assert to_jsonable(ds.head(5)) == reference("mds-pickle")


def test_shard_changed_since_discovery(tmp_path: Path) -> None:
    write_jsonl(tmp_path, shards=2)
    ds = Dataset.from_path("web", str(tmp_path))
    path = tmp_path / "part-0.jsonl"
    path.write_text(path.read_text() + '{"extra": true}\n')
    with pytest.raises(ObjectChanged) as info:
        ds.head(3)
    assert "part-0.jsonl" in str(info.value)


def test_local_index_cache_skips_the_scan(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "d", shards=4)
    first = Dataset.from_path("web", str(tmp_path / "d"))
    second = Dataset.from_path("web", str(tmp_path / "d"))
    assert (first.discovery_stats.indexed, first.discovery_stats.cache_hits) == (4, 0)
    assert (second.discovery_stats.indexed, second.discovery_stats.cache_hits) == (0, 4)
    assert second.discovery_stats.bytes_read == 0
    assert second.head(100) == first.head(100)
    (tmp_path / "d" / "part-1.jsonl").write_text('{"new": 1}\n')  # new version: rebuilt
    third = Dataset.from_path("web", str(tmp_path / "d"))
    assert (third.discovery_stats.indexed, third.discovery_stats.cache_hits) == (1, 3)
    assert third.shards[1].num_samples == 1


def test_natural_shard_order_and_globs(tmp_path: Path) -> None:
    for i in (10, 2, 1):
        (tmp_path / f"shard-{i}.jsonl").write_text(json.dumps({"i": i}) + "\n")
    (tmp_path / "other.jsonl").write_text('{"i": -1}\n')
    ds = Dataset.from_path("web", str(tmp_path / "shard-*.jsonl"))
    assert [s.uri.rsplit("/", 1)[1] for s in ds.shards] == [
        "shard-1.jsonl",
        "shard-2.jsonl",
        "shard-10.jsonl",
    ]
    single = Dataset.from_path("one", str(tmp_path / "other.jsonl"))
    assert single.head(1) == [{"i": -1}]


def test_mds_over_http_from_its_index_url(http_server: tuple[str, Path]) -> None:
    url, root = http_server
    shutil.copytree(FIXTURES / "mds", root / "mds-http", dirs_exist_ok=True)
    ds = Dataset.from_path("m", f"{url}/mds-http/index.json")
    assert ds.format == "mds" and ds.num_samples == 300
    assert to_jsonable(ds.head(300)) == reference("mds")


def test_http_shard_urls(http_server: tuple[str, Path], tmp_path: Path) -> None:
    url, root = http_server
    expected = write_jsonl(root / "jsonl-http", shards=2)
    ds = Dataset.from_path(
        "web", [f"{url}/jsonl-http/part-0.jsonl", f"{url}/jsonl-http/part-1.jsonl"]
    )
    assert ds.head(200) == expected[:114]


def test_from_records_round_trip() -> None:
    recs = [{"text": f"doc {i}", "n": i} for i in range(2345)]
    ds = Dataset.from_records("toy", recs, samples_per_shard=1000)
    assert [s.num_samples for s in ds.shards] == [1000, 1000, 345]
    assert ds.head(2345) == recs
    with pytest.raises(ConfigError, match="record 1"):
        Dataset.from_records("bad", [{"a": 1}, {"b": object()}])


def test_cli_index_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_jsonl(tmp_path / "d", shards=3)
    assert main(["index", str(tmp_path / "d")]) == 0
    assert (tmp_path / "d" / "_zephon_index.json").exists()
    ds = Dataset.from_path("web", str(tmp_path / "d"), index_cache=False)
    assert ds.discovery_stats.from_persistent_index == 3 and ds.discovery_stats.indexed == 0
    out_path = tmp_path / "elsewhere.json"
    assert main(["index", str(tmp_path / "d"), "--out", str(out_path)]) == 0
    (tmp_path / "d" / "_zephon_index.json").unlink()
    ds = Dataset.from_path("web", str(tmp_path / "d"), index=str(out_path), index_cache=False)
    assert ds.discovery_stats.from_persistent_index == 3
    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "d"), "--preview", "2"]) == 0
    out = capsys.readouterr().out
    assert "format    jsonl" in out and "samples   171" in out and "[1] {'id': 1" in out
    assert main(["inspect", str(tmp_path / "missing")]) == 1
    assert "NotFound" in capsys.readouterr().err


def test_cli_version_and_bad_storage_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import zephon
    from zephon.cli import main

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"zephon {zephon.__version__}"
    with pytest.raises(SystemExit, match="--storage-options is not valid JSON"):
        main(["inspect", str(tmp_path), "--storage-options", "{endpoint: x"])


def _corrupt_streams() -> dict[str, bytes]:
    import zstandard

    lines = b"".join(b'{"i": %d, "pad": "%s"}\n' % (i, b"x" * 40) for i in range(3000))
    gz = bytearray(gzip.compress(lines))
    gz[len(gz) // 2] ^= 0xFF
    zst = bytearray(zstandard.ZstdCompressor(write_checksum=True).compress(lines))  # as the CLI
    for at in range(len(zst) // 3, len(zst) // 3 + 16):
        zst[at] ^= 0x5A
    return {"flipped.jsonl.gz": bytes(gz), "flipped.jsonl.zst": bytes(zst), "plain.jsonl.gz": lines}


@pytest.mark.parametrize("name", list(_corrupt_streams()))
def test_corrupt_compressed_jsonl_is_a_format_error_naming_the_shard(
    tmp_path: Path, name: str
) -> None:
    (tmp_path / name).write_bytes(_corrupt_streams()[name])
    with pytest.raises(FormatError) as info:  # never an ExceptionGroup
        # zstd frames carry no checksum by default: flipped bytes may decode to garbage,
        # caught when the garbage is parsed
        ds = Dataset.from_path("z", str(tmp_path), index_cache=False)
        ds.head(ds.num_samples)
    assert name in str(info.value) and "'z'" in str(info.value)


@pytest.mark.parametrize("fmt", [None, "jsonl"])
def test_sidecar_files_beside_jsonl_shards_are_not_shards(tmp_path: Path, fmt: str | None) -> None:
    write_jsonl(tmp_path / "d", shards=2)
    d = tmp_path / "d"
    shards = sorted(p.name for p in d.iterdir())
    # another tool's index listing the shards, HF and Spark side files, checksums
    (d / "index.json").write_text(json.dumps({"shards": shards, "format": "jsonl"}))
    (d / "dataset_info.json").write_text(json.dumps({"features": {"id": "int64"}}))
    (d / "_SUCCESS").write_text("")
    (d / ".part-0.jsonl.crc").write_bytes(b"\x00crc")
    (d / "part-0.jsonl.crc").write_bytes(b"\x00crc")
    ds = Dataset.from_path("side", str(d), format=fmt, index_cache=False)
    assert ds.format == "jsonl"
    assert [s.uri.rsplit("/", 1)[1] for s in ds.shards] == shards
    plain = Dataset.from_path("plain", [str(d / s) for s in shards], index_cache=False)
    assert ds.num_samples == plain.num_samples


@pytest.mark.parametrize("sidecar", ["index.json", "dataset_info.json"])
def test_sidecar_beside_parquet_shards(tmp_path: Path, sidecar: str) -> None:
    write_parquet(tmp_path / "p")
    (tmp_path / "p" / sidecar).write_text(json.dumps({"shards": ["x"], "version": None}))
    ds = Dataset.from_path("pq", str(tmp_path / "p"), index_cache=False)
    assert ds.format == "parquet" and all(s.uri.endswith(".parquet") for s in ds.shards)


def test_cli_names_the_dataset_by_path_and_previews_whole_strings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "corpus").mkdir()
    long_text = "word " * 100
    (tmp_path / "corpus" / "a.jsonl").write_text(json.dumps({"id": 1, "text": long_text}) + "\n")
    assert main(["inspect", str(tmp_path / "corpus"), "--preview", "1"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("[0]"))
    assert "'text': 'word word" in line and "...' (+" in line and line.endswith("}")
    (tmp_path / "corpus" / "b.jsonl").write_text("not json\n")
    (tmp_path / "corpus" / "a.jsonl").unlink()
    assert main(["inspect", str(tmp_path / "corpus")]) == 1
    err = capsys.readouterr().err
    assert "'corpus'" in err and "'inspect'" not in err


def test_tokenize_refuses_a_hub_name_listing_what_it_accepts() -> None:
    from zephon.ops.tokenize import Tokenize

    with pytest.raises(ConfigError, match=r"'gpt2'.*not a tokenizer.json.*tiktoken.*'bytes'"):
        Tokenize("gpt2")


def test_cli_bench_reports_throughput_latency_and_the_busiest_stage(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_jsonl(tmp_path / "d", shards=3)
    assert main(["bench", str(tmp_path / "d"), "--seconds", "0.5", "--lanes", "2"]) == 0
    out = capsys.readouterr().out
    for line in ("first sample after", "samples/s", "latency p50", "busiest"):
        assert line in out, out
    assert main(["bench", str(tmp_path / "missing"), "--seconds", "0.1"]) == 1
    assert "missing" in capsys.readouterr().err


def test_cli_bench_plots_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    write_jsonl(tmp_path / "d", shards=3)
    png = tmp_path / "bench.png"
    assert main(["bench", str(tmp_path / "d"), "--seconds", "1.5", "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert f"plot         {png}" in out
    assert "times over: it repeats" in out  # a small dataset read for 1.5 s says so


@pytest.mark.parametrize("command", ["inspect", "index", "bench", "plan", "demo"])
def test_every_command_has_help_with_an_example(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    assert done.value.code == 0
    assert f"example: zephon {command}" in capsys.readouterr().out


def test_metadata_json_beside_shards_of_another_format_is_not_a_shard(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "a.tar", "w") as tar:
        for name, data in (("0.txt", b"a"), ("1.txt", b"b")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    (tmp_path / "reference.json").write_text('{"what": "metadata"}')
    ds = Dataset.from_path("t", str(tmp_path))
    assert ds.format == "webdataset" and ds.num_samples == 2
    (tmp_path / "more.jsonl").write_text('{"id": 1}\n')  # a real JSONL shard: mixed
    with pytest.raises(FormatError, match="mixed formats"):
        Dataset.from_path("t", str(tmp_path), index_cache=False)


def test_compressed_tars_and_unknown_files_say_what_is_readable(tmp_path: Path) -> None:
    (tmp_path / "a.tar.gz").write_bytes(b"\x1f\x8b" + bytes(30))
    with pytest.raises(FormatError, match=r"compressed tars \(a.tar.gz...\) cannot be read"):
        Dataset.from_path("t", str(tmp_path))
    (tmp_path / "a.tar.gz").unlink()
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(FormatError, match=r"\.vortex, a \.lance directory, or an index.json"):
        Dataset.from_path("t", str(tmp_path))


def test_python_dash_m_zephon_is_the_command() -> None:
    import subprocess
    import sys

    import zephon

    argv = [sys.executable, "-m", "zephon", "--version"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.strip() == f"zephon {zephon.__version__}"


def test_a_missing_file_is_named_as_given(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"no such file or directory: .*missing\.jsonl \["):
        Dataset.from_path("x", str(tmp_path / "missing.jsonl"))
    with pytest.raises(NotFound, match=r"no such file or directory: .*nodir \["):
        Dataset.from_path("x", str(tmp_path / "nodir") + "/")

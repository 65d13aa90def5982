"""The ``zephon`` command line: ``inspect``, ``index``, ``bench``, ``plan`` and ``demo``.

| module | owns |
| --- | --- |
| ``__main__`` | ``python -m zephon.cli`` |
| ``bench`` | ``zephon bench PATH``: read a dataset for a while and say how fast |
| ``datasets`` | ``zephon inspect`` and ``zephon index`` |
| ``plan`` | ``zephon plan CONFIG``: the plan of a curriculum before the run |
| ``demo`` | ``zephon demo``: a real pipeline over generated data in an embedded local S3 ser |
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from zephon.choices import DatasetFormat, choices

__all__ = ["main"]


def _options(text: str | None) -> dict[str, object]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SystemExit(f"zephon: --storage-options is not valid JSON ({exc})") from None
    if not isinstance(value, dict):
        raise SystemExit("zephon: --storage-options must be a JSON object")
    return value


def _parser() -> argparse.ArgumentParser:
    from zephon import __version__

    parser = argparse.ArgumentParser(
        prog="zephon",
        description="Zephon data loader tools",
        epilog="example: zephon inspect s3://bucket/web/  (zephon COMMAND --help for more)",
    )
    parser.add_argument("--version", action="version", version=f"zephon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def dataset_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("path", help="local path, glob, s3://, gs://, az://, http(s):// URL")
        p.add_argument("--format", default=None, choices=choices(DatasetFormat))
        p.add_argument("--storage-options", default=None, help="JSON object of backend options")
        p.add_argument(
            "--allow-pickle", action="store_true", help="allow pickled MDS/LitData fields"
        )

    def command(name: str, help: str, example: str) -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=help,
            description=help,
            epilog=f"example: {example}",
            formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        )

    inspect = command(
        "inspect",
        "format, shards, counts and a preview of a dataset",
        "zephon inspect s3://bucket/web/ --preview 5",
    )
    dataset_args(inspect)
    inspect.add_argument("--preview", type=int, default=3, help="samples to show")
    inspect.add_argument("--shards", type=int, default=10, help="shards to list")

    index = command(
        "index",
        "write a persistent index so discovery needs no scan",
        "zephon index gs://bucket/docs/",
    )
    dataset_args(index)
    index.add_argument("--out", default=None, help="where to write it (default: beside the data)")

    bench = command(
        "bench",
        "read a dataset for a while: throughput, first-sample time, "
        "fetch latency percentiles and the busiest stage",
        "zephon bench s3://bucket/web/ --seconds 20 --shuffle global",
    )
    dataset_args(bench)
    bench.add_argument("--seconds", type=float, default=10.0, help="how long to read")
    bench.add_argument("--shuffle", default="block", help="none, shards, block or global")
    bench.add_argument("--processes", type=int, default=0, help="decode processes")
    bench.add_argument("--lanes", type=int, default=1, help="lanes (independent streams)")
    bench.add_argument(
        "--plot", default=None, help="a PNG of samples/s, waits and stage busy time over the run"
    )

    plan = command(
        "plan",
        "what a curriculum will read before the run: samples, tokens, passes and phases per "
        "dataset, reads, bytes and their cost (planned from metadata only)",
        "zephon plan curriculum.toml --lanes 64 --plot plan.png",
    )
    plan.add_argument("config", help="a TOML or JSON file, or module:function")
    plan.add_argument("--lanes", type=int, default=1, help="lanes of the run (all ranks)")
    plan.add_argument("--samples", type=int, default=None, help="how far to plan (endless runs)")
    plan.add_argument("--get-price", type=float, default=0.0004, help="USD per 1,000 GETs")
    plan.add_argument("--egress-price", type=float, default=0.0, help="USD per GiB out")
    plan.add_argument("--json", action="store_true", help="the report as JSON")
    plan.add_argument("--plot", default=None, help="a PNG of the mixture and repetitions")

    demo = command(
        "demo", "stream a generated dataset from an embedded S3 server", "zephon demo --shards 32"
    )
    demo.add_argument("--shards", type=int, default=16)
    demo.add_argument("--shard-mib", type=int, default=4)
    demo.add_argument("--concurrency", type=int, default=16)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.command == "demo":
        from zephon.cli.demo import run_demo

        return run_demo(shards=args.shards, shard_mib=args.shard_mib, concurrency=args.concurrency)
    if args.command == "plan":
        from zephon.cli.plan import run_plan

        return run_plan(
            args.config,
            args.lanes,
            args.samples,
            args.get_price,
            args.egress_price,
            args.json,
            args.plot,
        )
    from zephon.cli.datasets import run_index, run_inspect

    options = _options(args.storage_options)
    if args.command == "bench":
        from zephon.cli.bench import run_bench

        return run_bench(
            args.path,
            args.format,
            options,
            args.allow_pickle,
            args.seconds,
            args.shuffle,
            args.processes,
            args.lanes,
            args.plot,
        )
    if args.command == "inspect":
        return run_inspect(
            args.path, args.format, options, args.allow_pickle, args.preview, args.shards
        )
    return run_index(args.path, args.format, options, args.allow_pickle, args.out)


if __name__ == "__main__":
    sys.exit(main())

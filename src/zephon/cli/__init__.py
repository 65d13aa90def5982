"""The ``zephon`` command line: ``inspect``, ``index`` and ``demo``."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

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


def main(argv: Sequence[str] | None = None) -> int:
    from zephon import __version__

    parser = argparse.ArgumentParser(prog="zephon", description="Zephon data loader tools")
    parser.add_argument("--version", action="version", version=f"zephon {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def dataset_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("path", help="local path, glob, s3://, gs://, az://, http(s):// URL")
        p.add_argument(
            "--format", default=None, help="jsonl, parquet, mds, webdataset, litdata, vortex, lance"
        )
        p.add_argument("--storage-options", default=None, help="JSON object of backend options")
        p.add_argument(
            "--allow-pickle", action="store_true", help="allow pickled MDS/LitData fields"
        )

    inspect = sub.add_parser("inspect", help="format, shards, counts and a preview of a dataset")
    dataset_args(inspect)
    inspect.add_argument("--preview", type=int, default=3, help="samples to show")
    inspect.add_argument("--shards", type=int, default=10, help="shards to list")

    index = sub.add_parser("index", help="write a persistent index so discovery needs no scan")
    dataset_args(index)
    index.add_argument("--out", default=None, help="where to write it (default: beside the data)")

    demo = sub.add_parser("demo", help="stream a generated dataset from an embedded S3 server")
    demo.add_argument("--shards", type=int, default=16)
    demo.add_argument("--shard-mib", type=int, default=4)
    demo.add_argument("--concurrency", type=int, default=16)

    args = parser.parse_args(argv)
    if args.command == "demo":
        from zephon.cli.demo import run_demo

        return run_demo(shards=args.shards, shard_mib=args.shard_mib, concurrency=args.concurrency)
    from zephon.cli.datasets import run_index, run_inspect

    options = _options(args.storage_options)
    if args.command == "inspect":
        return run_inspect(
            args.path, args.format, options, args.allow_pickle, args.preview, args.shards
        )
    return run_index(args.path, args.format, options, args.allow_pickle, args.out)


if __name__ == "__main__":
    sys.exit(main())

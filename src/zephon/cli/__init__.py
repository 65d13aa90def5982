"""The ``zephon`` command line: ``zephon demo`` (more subcommands join as they land)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="zephon", description="Zephon data loader tools")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="stream a generated dataset from an embedded S3 server")
    demo.add_argument("--shards", type=int, default=24)
    demo.add_argument("--shard-mib", type=int, default=4)
    demo.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from zephon.cli.demo import run_demo

        return run_demo(shards=args.shards, shard_mib=args.shard_mib, concurrency=args.concurrency)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())

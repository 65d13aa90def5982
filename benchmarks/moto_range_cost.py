"""What a ranged GET costs the moto server, against a whole-object GET of the same object.

The image benchmarks read tars of 34-45 MB by ranges of ~4 MB (one per block-shuffle run),
where WebDataset streams each tar in one GET. Real S3 serves a range for the cost of its
bytes; moto reads the whole object to serve any range, on the CPU the decoders share in
these one-machine benchmarks. This prints the server's CPU seconds per request both ways.

    .venv/bin/python benchmarks/moto_range_cost.py [--mb 44] [--ranges 10] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os

import boto3

from zephon.testing import MotoServer


def cpu_seconds(pid: int) -> float:
    """User + system CPU of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=44, help="object size")
    parser.add_argument("--ranges", type=int, default=10, help="ranges covering the object")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = MotoServer()
    endpoint = server.start()
    try:
        client = boto3.client(
            "s3",
            endpoint_url=endpoint.endpoint_url,
            aws_access_key_id=endpoint.key,
            aws_secret_access_key=endpoint.secret,
            region_name=endpoint.region_name,
        )
        client.create_bucket(Bucket="bench")
        size = args.mb << 20
        client.put_object(Bucket="bench", Key="obj", Body=os.urandom(size))
        pid = server.pid
        assert pid is not None
        step = -(-size // args.ranges)
        cost = {"whole": 0.0, "ranges": 0.0}
        for _ in range(args.rounds):
            before = cpu_seconds(pid)
            client.get_object(Bucket="bench", Key="obj")["Body"].read()
            cost["whole"] += cpu_seconds(pid) - before
            before = cpu_seconds(pid)
            for i in range(args.ranges):
                last = min(size, (i + 1) * step) - 1
                part = client.get_object(
                    Bucket="bench", Key="obj", Range=f"bytes={i * step}-{last}"
                )
                part["Body"].read()
            cost["ranges"] += cpu_seconds(pid) - before
    finally:
        server.stop()
    whole = cost["whole"] / args.rounds
    per_range = cost["ranges"] / args.rounds / args.ranges
    print(f"# one {args.mb} MB object on moto, server CPU per request, mean of {args.rounds}")
    print(f"whole-object GET:            {whole * 1000:7.1f} ms")
    print(
        f"GET of 1/{args.ranges} by range:        {per_range * 1000:7.1f} ms "
        f"({per_range / whole:.2f}x the whole object's cost for {1 / args.ranges:.2f}x "
        f"its bytes)"
    )
    print(
        f"the object in {args.ranges} ranges:     {per_range * args.ranges / whole:7.1f}x "
        "a whole-object GET"
    )


if __name__ == "__main__":
    main()

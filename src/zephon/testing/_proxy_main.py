"""Child process of :class:`zephon.testing.faults.ProxyProcess`: starts the proxy, prints its
URL, serves until its standard input closes (so it never outlives its parent)."""

from __future__ import annotations

import sys

from zephon.testing.faults import FaultProxy, Faults


def main() -> None:
    upstream, latency = sys.argv[1], float(sys.argv[2])
    with FaultProxy(upstream, Faults(latency_s=latency)) as proxy:
        print(proxy.url, flush=True)
        sys.stdin.read()


if __name__ == "__main__":
    main()

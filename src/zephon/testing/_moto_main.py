"""Child process of :class:`zephon.testing.MotoServer`: binds port 0, prints it, serves until
its standard input closes (so it never outlives its parent)."""

from __future__ import annotations

import logging
import sys


def main() -> None:
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    _, port = server.get_host_and_port()
    print(port, flush=True)
    sys.stdin.read()
    server.stop()


if __name__ == "__main__":
    main()

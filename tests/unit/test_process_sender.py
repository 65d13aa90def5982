"""The child-process engine's sender: items leave the child's event loop at once, queued for
the data pipe, up to a bound in items and bytes, in order."""

from __future__ import annotations

import asyncio
import multiprocessing

import pytest

from zephon.pipeline.process import AHEAD, AHEAD_BYTES, _Sender


@pytest.mark.parametrize("size", [200_000, AHEAD_BYTES // 2 + 1])
def test_sends_queue_while_the_pipe_is_full_up_to_the_bound(size: int) -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    admitted = AHEAD if size * AHEAD < AHEAD_BYTES else 2  # then bytes bind: 2 x > the bound

    async def main() -> list[bytes]:
        sender = _Sender(writer, asyncio.get_running_loop())
        payloads = [bytes([i]) * size for i in range(admitted + 1)]
        # None of these waits for the reader, although a pipe holds less than one of them.
        for p in payloads[:admitted]:
            await asyncio.wait_for(sender.send(p), timeout=10)
        over = asyncio.ensure_future(sender.send(payloads[admitted]))
        await asyncio.sleep(0)
        assert not over.done()  # the bound holds: it waits for the reader
        first = await asyncio.to_thread(reader.recv_bytes)
        await asyncio.wait_for(over, timeout=10)  # a message sent makes room
        rest = [await asyncio.to_thread(reader.recv_bytes) for _ in range(admitted)]
        last = asyncio.ensure_future(asyncio.to_thread(sender.finish, b"end"))
        tail = await asyncio.to_thread(reader.recv_bytes)
        await last
        assert [first, *rest] == payloads
        return [tail]

    assert asyncio.run(main()) == [b"end"]


def test_a_closed_reader_ends_the_sender_without_an_error() -> None:
    reader, writer = multiprocessing.Pipe(duplex=False)
    reader.close()

    async def main() -> None:
        sender = _Sender(writer, asyncio.get_running_loop())
        for _ in range(AHEAD + 3):  # each fails to send, and still makes room
            await asyncio.wait_for(sender.send(b"x" * 1000), timeout=10)
        await asyncio.to_thread(sender.finish, b"end")
        assert sender.broken

    asyncio.run(main())

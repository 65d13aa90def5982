"""Bounded channels between stages. Closing a channel is how a stage says "no more"."""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = ["Channel", "ChannelClosed", "Escaped", "carry", "closing"]

T = TypeVar("T")


class ChannelClosed(Exception):
    """Sending on a closed channel."""


class Channel(Generic[T]):
    """A FIFO of at most ``capacity`` items for one event loop.

    ``send`` waits while the channel is full (backpressure); ``receive`` waits while it is
    empty; ``close()`` ends the stream: receivers drain what is left, then iteration stops.
    ``close(error)`` makes receivers raise ``error`` once the buffer is drained.

    With ``max_bytes``, the channel is also full once the items it holds weigh that much
    (``weigh(item)``, e.g. a block's bytes); one item is always admitted, whatever its weight.
    ``on_take(item)`` is called as each item is received.
    """

    def __init__(
        self,
        capacity: int,
        max_bytes: int = 0,
        weigh: Callable[[T], int] | None = None,
        on_take: Callable[[T], None] | None = None,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if max_bytes and weigh is None:
            raise ValueError("a channel bounded in bytes needs weigh")
        self.capacity = capacity
        self.max_bytes = max_bytes
        self._weigh = weigh if max_bytes else None
        self._bytes = 0
        self._items: deque[T] = deque()
        self._closed = False
        self._sent = False
        self._error: BaseException | None = None
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._on_take = on_take

    def __len__(self) -> int:
        return len(self._items)

    @property
    def closed(self) -> bool:
        return self._closed

    def _full(self) -> bool:
        n = len(self._items)
        return n >= self.capacity or (
            n > 0 and self._weigh is not None and self._bytes >= self.max_bytes
        )

    async def send(self, item: T) -> None:
        while self._full() and not self._closed:
            self._writable.clear()
            await self._writable.wait()
        if self._closed:
            raise ChannelClosed("send on a closed channel")
        self._items.append(item)
        self._sent = True
        if self._weigh is not None:
            self._bytes += self._weigh(item)
        self._readable.set()

    def close(self, error: BaseException | None = None) -> None:
        """End the channel; readers get ``error`` (if any) once the items are drained. A
        ``KeyboardInterrupt`` or ``SystemExit`` is carried as :class:`Escaped`, so that no
        reader lets it escape an event loop."""
        if not self._closed:
            self._closed = True
            self._error = carry(error) if error is not None else None
        self._readable.set()
        self._writable.set()

    def discard(self) -> None:
        """Drop the items buffered (a stopped run's, which no one will receive)."""
        self._items.clear()
        self._bytes = 0
        self._writable.set()

    async def receive(self) -> T:
        """The next item; raises ``StopAsyncIteration`` once closed and drained."""
        while not self._items:
            if self._closed:
                if self._error is not None:
                    raise self._error
                raise StopAsyncIteration
            self._readable.clear()
            await self._readable.wait()
        item = self._items.popleft()
        if self._weigh is not None:
            self._bytes -= self._weigh(item)
        self._writable.set()
        if self._on_take is not None:
            self._on_take(item)
        return item

    async def ready(self) -> None:
        """Wait until an item has been sent (ever: it may be taken by now) or the channel is
        closed."""
        while not self._sent and not self._closed:
            await self._readable.wait()

    def __aiter__(self) -> Channel[T]:
        return self

    async def __anext__(self) -> T:
        return await self.receive()


class Escaped(Exception):
    """A ``KeyboardInterrupt`` or ``SystemExit`` raised by user code inside a stage, carried
    as an ordinary exception to the consumer, who raises ``original`` again. Left as is, it
    would escape the event loop and kill the loop's thread, and the consumer would wait
    forever."""

    def __init__(self, original: BaseException) -> None:
        super().__init__(f"{type(original).__name__} in a pipeline stage")
        self.original = original


def carry(exc: BaseException) -> BaseException:
    """``exc``, or an :class:`Escaped` carrying it if it would stop an event loop."""
    return Escaped(exc) if isinstance(exc, KeyboardInterrupt | SystemExit) else exc


@contextlib.contextmanager
def closing(channel: Channel[Any]) -> Iterator[None]:
    """Close ``channel`` when the block ends: normally on success, with the exception on
    failure, so a downstream stage never mistakes an upstream failure for the end of data.

    A cancelled stage leaves its channel open: cancellation reaches every stage of the task
    group at once, and the pipeline closes its output with the root error afterwards."""
    try:
        yield
    except asyncio.CancelledError:
        raise
    except BaseException as exc:
        channel.close(exc)
        raise
    else:
        channel.close()

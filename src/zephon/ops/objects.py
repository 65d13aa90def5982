"""fetch_field: samples that name another object (a JSONL row with an image key or URL) get
that object's bytes, read through the dataset's own storage client.

Reads run concurrently in the event loop (at most ``limit`` per block in flight, each also
under the storage's request limiter and byte budget), and each costs one request when the
object is at most ``guess`` bytes (:meth:`~zephon.storage.ManagedStorage.read_object`).
A missing object, or a field that names nothing readable, is bad input: a ``FormatError``
naming the dataset, shard and sample, which ``on_error="skip"`` skips and counts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from zephon.errors import FormatError, NotFound, redact_uri
from zephon.ops.block import Block, ref_at
from zephon.storage import ManagedStorage

__all__ = ["FetchField", "fetch_block"]


class FetchField:
    """What a ``fetch_field`` step reads: the object named by ``sample[field]`` (a key under
    ``prefix``, by default the dataset's root, or a URI in the same store) into
    ``sample[out]``."""

    def __init__(self, field: str, out: str | None, prefix: str | None, guess: int) -> None:
        self.field, self.out, self.prefix, self.guess = field, out or field, prefix, guess
        self.__name__ = f"fetch_field({field!r}, out={self.out!r}, prefix={prefix!r})"

    def uri(self, sample: Any, root: str) -> str:
        """The URI ``sample`` names, resolved against ``prefix`` or the dataset's ``root``."""
        value = sample.get(self.field) if isinstance(sample, dict) else None
        if not isinstance(value, str) or not value:
            got = type(value).__name__ if isinstance(sample, dict) else type(sample).__name__
            raise FormatError(f"field {self.field!r} holds {got}, not an object key or URI")
        base = self.prefix or root
        if "://" in value:
            if value.split("://", 1)[0] != base.split("://", 1)[0]:
                raise FormatError(f"field {self.field!r} names {redact_uri(value)}, outside the "
                                  f"dataset's store ({redact_uri(base)})")  # fmt: skip
            return value
        return base.rstrip("/") + "/" + value.lstrip("/")


async def fetch_block(
    step: FetchField, block: Block, storages: Sequence[ManagedStorage], datasets: Sequence[Any],
    limit: int, on_skip: Callable[[Any, str], None] | None,
) -> Block:  # fmt: skip
    """``block`` with each sample's object read into it (in order), weighing their bytes as
    well; samples whose object is missing are dropped and reported to ``on_skip`` when
    given, else raise."""
    gate = asyncio.Semaphore(limit)
    provenance = block.provenance()

    async def one(pos: int, item: Any) -> Any:
        ref = ref_at(provenance, pos)
        d, shard, sample = ref[:3]
        ds = datasets[d]
        try:
            uri = step.uri(item, ds.root)
            async with gate:
                try:
                    data = await storages[d].read_object(uri, step.guess)
                except NotFound:
                    raise FormatError(f"field {step.field!r} names {redact_uri(uri)}, which "
                                      "does not exist") from None  # fmt: skip
        except FormatError as exc:
            where = f"dataset {ds.name!r}, shard {ds.shards[shard].uri}, sample {sample}"
            if on_skip is None:
                raise FormatError(f"{exc} ({where})") from None
            on_skip(ref, f"{step.__name__}: {exc}")
            return None
        return {**item, step.out: data}

    async with asyncio.TaskGroup() as tg:
        tasks = [tg.create_task(one(pos, item)) for pos, item in enumerate(block.items)]
    results = [t.result() for t in tasks]
    out = block.kept([r is not None for r in results], [r for r in results if r is not None])
    out.nbytes += sum(len(r[step.out]) for r in results if r is not None)  # channels weigh it
    return out

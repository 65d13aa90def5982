"""The child-process engine's shared-memory slots: the child keeps every segment until the
parent has copied out of it. The parent opens a segment only when it reaches the item, so a
child that unlinked its segments as soon as it had sent its last items took them away from
the parent (FileNotFoundError for the run's last items, in a slot first used near the end,
3 runs in 12 of tests/unit/test_worker_results.py's process-engine test)."""

from __future__ import annotations

import asyncio
from multiprocessing.shared_memory import SharedMemory

import numpy as np

from zephon.pipeline.slots import SLOTS, Slots, join, split


async def _write(slots: Slots, value: int) -> tuple[int, str, object]:
    arrays: list[np.ndarray] = []
    rest = split({"x": np.full(100_000, value, np.uint8), "n": value}, arrays)
    slot, name = await slots.write(arrays, rest)
    return slot, name, rest


def test_the_child_waits_for_the_parent_before_unlinking_its_segments() -> None:
    async def main() -> None:
        slots = Slots(asyncio.get_running_loop())
        written = [await _write(slots, v) for v in range(SLOTS)]
        settled = asyncio.ensure_future(slots.settled())
        for slot, name, rest in written:  # the parent, an item at a time
            for _ in range(3):
                await asyncio.sleep(0)  # let every ready callback run
            assert not settled.done()  # this item's segment is still there to open
            opened = SharedMemory(name=name)
            assert opened.buf is not None
            item = join(rest, opened.buf)
            assert item["n"] == item["x"][0] and len(item["x"]) == 100_000
            opened.close()
            slots.release(slot)
        await asyncio.wait_for(settled, timeout=10)  # every slot back: the child may close
        slots.close()

    asyncio.run(main())


def test_a_parent_that_wants_nothing_more_does_not_hold_the_child() -> None:
    async def main() -> None:
        slots = Slots(asyncio.get_running_loop())
        await _write(slots, 1)
        settled = asyncio.ensure_future(slots.settled())
        await asyncio.sleep(0)
        assert not settled.done()
        slots.stop()  # the parent closed the engine (or died: its control pipe ended)
        await asyncio.wait_for(settled, timeout=10)
        slots.close()

    asyncio.run(main())

from __future__ import annotations

import asyncio

import pytest

from zephon.storage.gate import AdaptiveConcurrency, CapacityGate


async def test_gate_bounds_and_serves_fifo() -> None:
    gate = CapacityGate(10)
    await gate.acquire(6)
    order: list[str] = []

    async def take(name: str, n: int) -> None:
        await gate.acquire(n)
        order.append(name)

    big = asyncio.create_task(take("big", 8))
    small = asyncio.create_task(take("small", 1))
    await asyncio.sleep(0)  # let both queue up
    assert order == [] and gate.held == 6  # small fits, but must not overtake big
    gate.release(6)
    await asyncio.gather(big, small)
    assert order == ["big", "small"] and gate.held == 9


async def test_oversized_request_is_admitted_alone() -> None:
    gate = CapacityGate(4)
    async with gate.hold(100):
        assert gate.held == 100
        waiter = asyncio.create_task(gate.acquire(1))
        await asyncio.sleep(0)
        assert not waiter.done()
    await waiter
    assert gate.held == 1


async def test_cancelled_waiter_leaves_no_hold() -> None:
    gate = CapacityGate(1)
    await gate.acquire()
    waiter = asyncio.create_task(gate.acquire())
    await asyncio.sleep(0)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    gate.release()
    assert gate.held == 0
    await gate.acquire()
    assert gate.held == 1


async def test_shrinking_capacity_blocks_new_work_until_released() -> None:
    gate = CapacityGate(4)
    for _ in range(4):
        await gate.acquire()
    gate.set_capacity(2)
    waiter = asyncio.create_task(gate.acquire())
    gate.release()
    gate.release()
    await asyncio.sleep(0)
    assert not waiter.done()  # 2 held == capacity 2
    gate.release()
    await waiter
    assert gate.held == 2


def test_aimd_cuts_once_per_generation_and_recovers() -> None:
    ctl = AdaptiveConcurrency(64, min_requests=2)
    import time

    before = time.monotonic()
    ctl.on_throttle(before)
    assert ctl.limit == 32
    ctl.on_throttle(before)  # same generation: sent under the old limit, says nothing new
    assert ctl.limit == 32
    ctl.on_throttle(time.monotonic())
    assert ctl.limit == 16 and ctl.cuts == 2
    for _ in range(10):
        ctl.on_throttle(time.monotonic())
    assert ctl.limit == 2  # floored
    for _ in range(5000):
        ctl.on_success()
    assert ctl.limit == 64  # recovered, capped


def test_invalid_bounds_are_rejected() -> None:
    with pytest.raises(ValueError):
        CapacityGate(0)
    with pytest.raises(ValueError):
        AdaptiveConcurrency(4, min_requests=5)


async def test_a_slow_start_grows_by_what_is_used_up_to_the_capacity() -> None:
    gate = CapacityGate(100, start=10)
    assert gate.capacity == 10
    await gate.acquire(5)
    await gate.acquire(5)
    waiter = asyncio.create_task(gate.acquire(8))
    await asyncio.sleep(0)
    assert not waiter.done()  # beyond the starting capacity
    gate.release(5)  # released, not used downstream: the capacity stays
    await asyncio.sleep(0)
    assert not waiter.done() and gate.capacity == 10
    gate.grow(5)  # used: the capacity grows by as much
    await waiter
    assert gate.capacity == 15 and gate.held == 13
    for _ in range(20):
        gate.grow(5)
    assert gate.capacity == 100  # never beyond the limit


async def test_a_loan_raises_a_slow_start_for_its_borrowers_while_it_lasts() -> None:
    gate = CapacityGate(100, start=10)
    await gate.acquire(10)
    may_borrow = False
    waiter = asyncio.create_task(gate.acquire(20, lambda: may_borrow))
    other = asyncio.create_task(gate.acquire(1))  # queued behind it, never borrows
    await asyncio.sleep(0)
    gate.lend(30)
    await asyncio.sleep(0)
    assert not waiter.done()  # lent, but not to this one (yet)
    may_borrow = True  # asked again as the gate looks at its waiters
    gate.lend(0)
    await waiter
    assert gate.held == 30
    await asyncio.sleep(0)
    assert not other.done()  # 30 held of a capacity of 10: it may not use the loan
    gate.lend(-30)  # given back
    gate.release(20)
    await asyncio.sleep(0)
    assert not other.done()  # 10 held of 10
    gate.release(10)
    await other
    gate.lend(-50)  # more than was lent: the loan ends, the capacity stays
    assert gate.capacity == 10


async def test_a_loan_never_lifts_the_limit() -> None:
    gate = CapacityGate(20, start=5)
    await gate.acquire(5)
    gate.lend(1000)
    await gate.acquire(15, lambda: True)
    waiter = asyncio.create_task(gate.acquire(1, lambda: True))
    await asyncio.sleep(0)
    assert not waiter.done() and gate.held == 20
    gate.release(1)
    await waiter


async def test_a_whole_acquire_may_use_the_limit_but_not_beyond_it() -> None:
    gate = CapacityGate(20, start=5)
    await gate.acquire(5)
    await gate.acquire(10, whole=True)  # past the slow start's 5: within the limit
    plain = asyncio.create_task(gate.acquire(1))
    await asyncio.sleep(0)
    assert not plain.done() and gate.capacity == 5  # the slow start itself did not grow
    whole = asyncio.create_task(gate.acquire(6, whole=True))
    await asyncio.sleep(0)
    assert not whole.done()  # first come, first served: behind the plain waiter
    gate.release(10)
    await asyncio.sleep(0)
    assert not plain.done()  # 5 held of a capacity of 5
    gate.release(5)
    await plain
    await whole
    assert gate.held == 7
    beyond = asyncio.create_task(gate.acquire(14, whole=True))
    await asyncio.sleep(0)
    assert not beyond.done()  # 7 + 14 > the limit of 20
    gate.release(1)
    await beyond


def test_a_lane_on_workers_grows_by_what_it_delivers_or_before_a_step_that_holds_items() -> None:
    from tests import pipeline_fns as fns
    from zephon import Dataset, Pipeline, StaticMixtureWorkSource
    from zephon.pipeline.steps import growth_step

    ds = Dataset.from_records("r", [{"id": i} for i in range(100)], samples_per_shard=10)
    pipe = Pipeline(StaticMixtureWorkSource([ds]), rank=0, world_size=1)
    pooled = pipe.map(fns.as_text, processes=2)
    assert growth_step(pooled.map(fns.as_text).batch(8).spec) == 2  # the lane's last step
    assert growth_step(pooled.shuffle(64).batch(8).spec) == 2  # a shuffle's first parts leave
    assert growth_step(pooled.map(fns.as_text).shuffle(64, warmup=0).batch(8).spec) == 1
    assert growth_step(pooled.pack(4, field="id").batch(2).spec) == 0
    assert growth_step(pipe.map(fns.as_text).batch(8).spec) is None  # in process: by intake


async def test_a_cancelled_waiter_that_a_release_passed_over_ends_cancelled() -> None:
    """A waiter cancelled while a release wakes the queue: the release drops its (done)
    future from the queue before the waiter runs again. The waiter once tried to remove it
    a second time and ended in ``ValueError`` instead of ``CancelledError`` (an unraisable
    "Task exception was never retrieved" when a run was stopped)."""
    gate = CapacityGate(1)
    await gate.acquire(1)
    waiter = asyncio.create_task(gate.acquire(1))
    await asyncio.sleep(0)  # queued behind the hold
    waiter.cancel()  # its future is cancelled now; the task runs later
    gate.release(1)  # wakes the queue, which drops the cancelled future
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert gate.held == 0
    await gate.acquire(1)  # and the gate still works
    assert gate.held == 1


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


async def _admitted(gate: CapacityGate, n: int, whole: bool = False) -> bool:
    """Whether ``acquire(n)`` is granted now (the attempt is withdrawn if not)."""
    task = asyncio.create_task(gate.acquire(n, whole=whole))
    await asyncio.sleep(0)  # one turn of the loop: granted at once or queued
    if task.done():
        return True
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    return False


async def test_read_ahead_holds_a_second_of_consumption_and_follows_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget of 100 units consumed at 20 units/s lets at most 20 be held (a second's
    worth), never less than the floor, the whole budget before the first measure; a faster
    consumer raises the ceiling within a period, a slower one lowers it."""
    from zephon.storage import gate as gate_module
    from zephon.storage.gate import ReadAhead

    clock = _Clock()
    monkeypatch.setattr(gate_module.time, "monotonic", clock)
    gate = CapacityGate(100, horizon=ReadAhead(1.0, floor=5))
    assert await _admitted(gate, 90)  # no ceiling yet: the budget rules
    gate.release(90)  # starts the first period
    for _ in range(10):  # 2 units every 0.1 s: 20 units/s
        clock.now += 0.1
        await gate.acquire(2)
        gate.release(2)
    assert gate.horizon is not None and gate.horizon.ceiling == 20
    assert await _admitted(gate, 20) and not await _admitted(gate, 1)
    assert await _admitted(gate, 50, whole=True)  # an opening read: the budget, not the ceiling
    gate.release(70)
    for _ in range(10):  # 10 units every 0.1 s: the ceiling rises with the consumer
        clock.now += 0.1
        await gate.acquire(10)
        gate.release(10)
    assert gate.horizon.ceiling is not None and gate.horizon.ceiling > 40
    for _ in range(8):  # a consumer that paused: down to the floor, never to nothing
        clock.now += 30.0
        gate.release(0)
    assert gate.horizon.ceiling == 5
    assert await _admitted(gate, 5) and not await _admitted(gate, 1)

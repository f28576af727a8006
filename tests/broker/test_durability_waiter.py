"""The broker shares one asyncio future per store flush group."""
from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
from ferry.errors import FlushTimeoutError
from ferry_broker.durability import DurabilityWaiter


async def test_waiters_of_one_group_share_it_and_all_complete() -> None:
    waiter = DurabilityWaiter(timeout_ms=5000)
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    waits = [waiter.wait(group) for _ in range(50)]
    assert len(waiter) == 1
    group.set_result(None)
    await asyncio.gather(*waits)
    await asyncio.sleep(0)
    assert len(waiter) == 0


async def test_a_cancelled_request_does_not_cancel_its_group() -> None:
    waiter = DurabilityWaiter(timeout_ms=5000)
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    first, second = waiter.wait(group), waiter.wait(group)
    first.cancel()
    await asyncio.sleep(0)
    assert not group.cancelled()
    group.set_result(None)
    await second


async def test_a_store_failure_reaches_every_waiter() -> None:
    waiter = DurabilityWaiter(timeout_ms=5000)
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    waits = [waiter.wait(group) for _ in range(3)]
    group.set_exception(FlushTimeoutError("slow disk"))
    for w in waits:
        with pytest.raises(FlushTimeoutError):
            await w


async def test_backstop_fails_a_group_the_store_never_resolves() -> None:
    waiter = DurabilityWaiter(timeout_ms=0)  # backstop after 1 s
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    with pytest.raises(FlushTimeoutError):
        await asyncio.wait_for(waiter.wait(group), 5)


async def test_late_completion_after_the_backstop_is_dropped_quietly() -> None:
    loop = asyncio.get_running_loop()
    seen: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        waiter = DurabilityWaiter(timeout_ms=0)  # backstop after 1 s
        group: concurrent.futures.Future[None] = concurrent.futures.Future()
        with pytest.raises(FlushTimeoutError):
            await asyncio.wait_for(waiter.wait(group), 5)
        # The flush thread finishes the group after all, from its own thread.
        await asyncio.to_thread(group.set_result, None)
        for _ in range(5):
            await asyncio.sleep(0.01)
        assert seen == []
        assert len(waiter) == 0
    finally:
        loop.set_exception_handler(None)


async def test_a_group_already_done_completes_at_once() -> None:
    waiter = DurabilityWaiter(timeout_ms=5000)
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    group.set_result(None)
    await asyncio.wait_for(waiter.wait(group), 1)


async def test_the_flush_starts_once_per_group_after_the_loop_turn() -> None:
    """The store's start_flush runs after the requests of this loop turn were put."""
    waiter = DurabilityWaiter(timeout_ms=5000)
    group: concurrent.futures.Future[None] = concurrent.futures.Future()
    starts: list[int] = []
    waits = [waiter.wait(group, lambda: starts.append(len(waits))) for _ in range(3)]
    assert starts == []  # not yet: later requests of this turn join the group first
    await asyncio.sleep(0)
    assert starts == [3]
    group.set_result(None)
    await asyncio.gather(*waits)

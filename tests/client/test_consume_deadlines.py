"""The runner's consume-timeout deadlines (`consume_timeout.Deadlines`) on a real event loop.

Late handlers expire in start order at their own deadline, finished ones never,
and however many handlers run, ONE timer waits for the oldest deadline (not one
armed and cancelled per record: `run()` pays that per message). The mesh-level
behaviour (the record sent back, the queue moving on) is test_consume_timeout's.
"""
from __future__ import annotations

import asyncio
from typing import Any

from ferry.client.consuming.consume_timeout import Deadlines

HANDLERS = 200
TIMEOUT_S = 0.2


class CountingLoop(asyncio.SelectorEventLoop):
    """An ordinary selector loop that counts the timers asked of it."""

    timers = 0

    def call_at(self, when: float, callback: Any, *args: Any, context: Any = None
                ) -> asyncio.TimerHandle:
        self.timers += 1
        return super().call_at(when, callback, *args, context=context)


async def _scenario() -> tuple[list[int], int, Deadlines]:
    expired: list[int] = []
    names: dict[asyncio.Task[Any], int] = {}
    deadlines = Deadlines(TIMEOUT_S, lambda task: expired.append(names[task]))
    loop = asyncio.get_running_loop()
    assert isinstance(loop, CountingLoop)
    before = loop.timers
    hang = asyncio.Event()
    tasks = []
    for i in range(HANDLERS):
        # Even handlers finish at once, odd ones hang: their deadlines pass.
        task = loop.create_task(asyncio.sleep(0) if i % 2 == 0 else hang.wait())
        names[task] = i
        deadlines.arm(task)
        tasks.append(task)
        if i == HANDLERS // 2:
            await asyncio.sleep(TIMEOUT_S / 2)   # the second half starts later: due later
    for task in tasks[::2]:
        await task
        assert deadlines.disarm(task) is False   # finished in time: its own outcome
    await asyncio.sleep(TIMEOUT_S * 0.75)
    first_half = list(expired)
    await asyncio.sleep(TIMEOUT_S)
    timers = loop.timers - before
    for task in tasks[1::2]:
        assert deadlines.disarm(task) is True    # expired: its late outcome is ignored
        deadlines.forget(task)
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    assert first_half == list(range(1, HANDLERS // 2 + 1, 2))
    return expired, timers, deadlines


def test_late_handlers_expire_in_start_order_with_one_timer_for_all() -> None:
    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        expired, timers, deadlines = runner.run(_scenario())
    assert expired == list(range(1, HANDLERS, 2))   # every late one, once, in start order
    # One timer waits for the oldest deadline at a time: about one for each half's
    # deadlines (a few more on a loaded machine, where the arms of one half spread over
    # several milliseconds and a timer fires before the later ones are due), plus the
    # scenario's asyncio.sleep calls; one per handler would be HANDLERS or more.
    assert timers < HANDLERS // 4, timers
    assert not deadlines.expired


def test_a_deadline_dropped_before_it_is_due_leaves_no_timer_and_no_expiry() -> None:
    async def scenario() -> list[asyncio.Task[Any]]:
        expired: list[asyncio.Task[Any]] = []
        deadlines = Deadlines(TIMEOUT_S, expired.append)
        task = asyncio.get_running_loop().create_task(asyncio.sleep(10))
        deadlines.arm(task)
        assert deadlines.disarm(task) is False
        await asyncio.sleep(TIMEOUT_S * 1.5)
        task.cancel()
        return expired

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        assert runner.run(scenario()) == []


def test_no_timeout_arms_nothing() -> None:
    async def scenario() -> int:
        loop = asyncio.get_running_loop()
        assert isinstance(loop, CountingLoop)
        deadlines = Deadlines(None, lambda task: None)
        before = loop.timers
        task = loop.create_task(asyncio.sleep(0))
        deadlines.arm(task)
        await task
        assert deadlines.disarm(task) is False
        return loop.timers - before

    with asyncio.Runner(loop_factory=CountingLoop) as runner:
        assert runner.run(scenario()) == 0

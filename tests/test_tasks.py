"""Background task helpers (ferry.tasks): cancel, one task per key, a step repeated."""
from __future__ import annotations

import asyncio
import logging

import pytest
from ferry.tasks import KeyedTasks, cancel_and_wait, repeat


async def test_cancel_and_wait_ends_a_task_and_accepts_none() -> None:
    task = asyncio.create_task(asyncio.sleep(3600))
    await cancel_and_wait(task)
    assert task.cancelled()
    await cancel_and_wait(None)


async def test_keyed_tasks_follow_the_wanted_keys_and_restart_ended_ones() -> None:
    runs: list[str] = []

    async def run(key: str) -> None:
        runs.append(key)
        if key != "once":
            await asyncio.sleep(3600)

    tasks: KeyedTasks[str] = KeyedTasks()
    assert sorted(await tasks.reconcile({"a", "once"}, run, str)) == ["a", "once"]
    await asyncio.sleep(0)
    assert len(tasks) == 2
    assert await tasks.reconcile({"a", "once"}, run, str) == ["once"]   # it had ended
    assert await tasks.reconcile({"b"}, run, str) == ["b"]
    assert len(tasks) == 1
    await tasks.stop()
    assert len(tasks) == 0


async def test_repeat_outlives_a_failing_step(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("boom")
        if calls == 3:
            raise asyncio.CancelledError

    with caplog.at_level(logging.ERROR), pytest.raises(asyncio.CancelledError):
        await repeat(step, logging.getLogger("t"), "the step", error_pause_s=0.001)
    assert calls == 3
    assert [m for m in caplog.messages if m == "the step failed; going on"]

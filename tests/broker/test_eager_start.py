"""start_eager (ferry_broker.eager_start) on a real event loop: a request's first step
runs at once; a task goes on only with one that waits, and passes everything through."""
from __future__ import annotations

import asyncio
import contextvars

import pytest
from ferry_broker.eager_start import start_eager


async def test_a_coroutine_that_never_waits_finishes_inside_the_call_with_no_task() -> None:
    seen: list[str] = []

    async def request() -> None:
        seen.append("ran")

    assert start_eager(request()) is None
    assert seen == ["ran"]


async def test_a_waiting_coroutine_goes_on_in_a_task_with_what_it_awaited() -> None:
    seen: list[object] = []
    fut: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    async def request() -> None:
        seen.append("first step")
        seen.append(await fut)
        await asyncio.sleep(0)  # a bare yield passes through as well
        seen.append(await asyncio.sleep(0.001, "slept"))

    task = start_eager(request())
    assert task is not None and seen == ["first step"]
    await asyncio.sleep(0)
    assert not task.done()
    fut.set_result("answer")
    await task
    assert seen == ["first step", "answer", "slept"]


async def test_an_error_after_the_first_wait_is_the_tasks_error() -> None:
    async def request() -> None:
        await asyncio.sleep(0)
        raise ValueError("late")

    task = start_eager(request())
    assert task is not None
    with pytest.raises(ValueError, match="late"):
        await task


async def test_cancelling_the_task_cancels_the_coroutine_where_it_waits() -> None:
    seen: list[str] = []
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def request() -> None:
        try:
            await fut
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            seen.append("cleaned up")

    task = start_eager(request())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen == ["cancelled", "cleaned up"] and fut.cancelled()


async def test_a_coroutine_may_catch_the_cancellation_and_finish() -> None:
    async def request() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            await asyncio.sleep(0)  # it may still wait after catching it

    task = start_eager(request())
    assert task is not None
    await asyncio.sleep(0)
    task.cancel()
    await task
    assert task.done() and not task.cancelled()


_VAR: contextvars.ContextVar[str] = contextvars.ContextVar("eager_test", default="outer")


async def test_a_context_variable_set_before_the_first_wait_stays_in_the_request() -> None:
    """Set before the first await and reset after it (a span made current around an
    await): the reset works, and the caller's context never sees the value."""
    gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    seen: list[str] = []

    async def request() -> None:
        token = _VAR.set("request")
        await gate
        seen.append(_VAR.get())
        _VAR.reset(token)   # ValueError if the task ran in another context than the set

    task = start_eager(request())
    assert task is not None
    assert _VAR.get() == "outer"   # the connection's context is untouched
    gate.set_result(None)
    await task
    assert seen == ["request"]
    assert _VAR.get() == "outer"

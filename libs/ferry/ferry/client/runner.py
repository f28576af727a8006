"""Push-style consumption: `await consumer.run(handler, concurrency=N)`.

Up to N handler calls run at once. A handler that returns has consumed its
record; one that raises has it nacked (back-off from the group's retry
policy). Every record handed to a handler is held in the consumer's
`PendingOffsets` until its outcome is stored (returned, or nacked and the
copy acknowledged by a broker), so offsets commit only up to the lowest
record still in flight on each queue.

`run` returns when the consumer stops. In-flight handlers then get
`RUN_STOP_GRACE_MS` to finish before they are cancelled; what did not finish
is not committed and will be delivered again. When the task running `run` is
cancelled instead, its handlers are cancelled at once and the queues they
were on are rewound to their lowest unfinished record, so a later `run` (or
iteration) sees those records again.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ferry.client.message import ConsumerRecord, TopicQueue
from ferry.client.retry import PendingOffsets

if TYPE_CHECKING:
    from ferry.client.consumer import Consumer

log = logging.getLogger(__name__)

Handler = Callable[[ConsumerRecord], Awaitable[Any]]

#: How long stop() lets running handlers finish before cancelling them.
RUN_STOP_GRACE_MS = 5_000
#: How long one wait for records lasts before the loop checks for a stop again.
_POLL_MS = 500
MAX_CONCURRENCY = 10_000


class Runner:
    """One `run()` call: takes records, runs handlers, records their outcome."""

    def __init__(self, consumer: Consumer, handler: Handler, concurrency: int,
                 pending: PendingOffsets) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY}")
        self.consumer = consumer
        self.handler = handler
        self.concurrency = concurrency
        self.pending = pending
        self.running: dict[asyncio.Task[None], tuple[TopicQueue, int]] = {}
        self._slot_free = asyncio.Event()

    async def run(self) -> None:
        consumer = self.consumer
        try:
            while consumer.started:
                if len(self.running) >= self.concurrency:
                    self._slot_free.clear()
                    await self._slot_free.wait()
                    continue
                batch = await consumer.getmany(timeout_ms=_POLL_MS,
                                               max_records=self.concurrency - len(self.running))
                for tq, records in batch.items():
                    for record in records:
                        self._start(tq, record)
        except asyncio.CancelledError:
            await self._abandon()
            raise

    def _start(self, tq: TopicQueue, record: ConsumerRecord) -> None:
        # Held before the next getmany() promotes the position: commits stop below it.
        self.pending.add(tq, record.queue_offset)
        task = asyncio.get_running_loop().create_task(self._handle(tq, record))
        self.running[task] = (tq, record.queue_offset)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        self._slot_free.set()

    async def _handle(self, tq: TopicQueue, record: ConsumerRecord) -> None:
        try:
            await self.handler(record)
        except asyncio.CancelledError:
            raise   # not finished: stays pending, so it is not committed
        except Exception as exc:
            log.warning("handler failed on %s (%s offset %d, attempt %d): %r; nacking",
                        record.msg_id, tq, record.queue_offset, record.reconsume_times, exc)
            try:
                await self.consumer.nack(record)
            except Exception as nack_exc:   # stopped meanwhile: left pending, redelivered
                log.warning("nack of %s not stored: %s", record.msg_id, nack_exc)
                return
        self.pending.discard(tq, record.queue_offset)

    async def wind_down(self, grace_ms: int = RUN_STOP_GRACE_MS) -> None:
        """Let running handlers finish for up to `grace_ms`, then cancel the rest."""
        tasks = list(self.running)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_ms / 1000)
        for task in list(self.running):
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _abandon(self) -> None:
        """Cancel the handlers and rewind their queues to the lowest unfinished record."""
        unfinished = list(self.running.values())
        lowest: dict[TopicQueue, int] = {}
        for tq, offset in unfinished:
            lowest[tq] = min(offset, lowest.get(tq, offset))
        await self.wind_down(grace_ms=0)
        for tq, offset in unfinished:
            self.pending.discard(tq, offset)
        for tq, offset in lowest.items():
            await self.consumer.rewind(tq, offset)

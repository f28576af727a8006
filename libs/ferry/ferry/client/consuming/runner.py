"""Push-style consumption: `await consumer.run(handler, concurrency=N)`.

Up to N handler calls run at once. A handler that returns has consumed its
record; one that raises has it nacked (back-off from the group's retry
policy). Every record handed to a handler is held in the consumer's
`PendingOffsets` until its outcome is stored (returned, or nacked and the
copy acknowledged by a broker), so offsets commit only up to the lowest
record still in flight on each queue. A handler still running after the
consume timeout is cancelled and its record sent back (`consume_timeout`).

`run` returns when the consumer stops. In-flight handlers then get
`RUN_STOP_GRACE_MS` to finish before they are cancelled; what did not finish
is not committed and will be delivered again. When the task running `run` is
cancelled instead, its handlers are cancelled at once and the queues they
were on are rewound to their lowest unfinished record, so a later `run` (or
iteration) sees those records again.

`OrderedRunner` is `run(handler, ordered=True)`: one record per queue at a
time, retried in place (see `ferry.client.consuming.ordered` for the queue locks).
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ferry.client.consuming.consume_timeout import Deadlines, call_within, ignore_late
from ferry.client.consuming.fetcher import QueueFetcher
from ferry.client.consuming.ordered import OrderedQueues
from ferry.client.consuming.retry import Nacker, PendingOffsets
from ferry.client.core.batch_hook import BatchHook, batch_hook
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.errors import FerryError

log = logging.getLogger(__name__)

Handler = Callable[[ConsumerRecord], Awaitable[Any]]


class RunnerHost(Protocol):
    """What a runner uses of its `ferry.client.consuming.consumer.Consumer` (which imports this module)."""

    mode: str

    @property
    def started(self) -> bool: ...

    async def getmany(self, timeout_ms: int = 0, max_records: int | None = None
                      ) -> dict[TopicQueue, list[ConsumerRecord]]: ...

    async def nack(self, record: ConsumerRecord, delay_ms: int | None = None) -> None: ...

    def note_received(self, tq: TopicQueue, records: list[ConsumerRecord]) -> None: ...

    async def rewind(self, tq: TopicQueue, offset: int) -> None: ...


#: How long stop() lets running handlers finish before cancelling them.
RUN_STOP_GRACE_MS = 5_000
#: How long one wait for records lasts before the loop checks for a stop again.
_POLL_MS = 500
MAX_CONCURRENCY = 10_000
#: How many records of one queue an ordered worker handles in a row before it
#: gives its slot to another queue (when `concurrency` is below the queue count).
MAX_BURST = 64


class Runner:
    """One `run()` call: takes records, runs handlers, records their outcome."""

    def __init__(self, consumer: RunnerHost, handler: Handler, concurrency: int,
                 pending: PendingOffsets, consume_timeout_s: float | None = None) -> None:
        if not 1 <= concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"concurrency must be in 1..{MAX_CONCURRENCY}")
        self.consumer = consumer
        self.handler = handler
        self.concurrency = concurrency
        self.pending = pending
        self.running: dict[asyncio.Task[None], tuple[TopicQueue, int]] = {}
        # A handler past its consume timeout gives its record back (see consume_timeout).
        self.deadlines = Deadlines(consume_timeout_s, self._expire)
        self.records: dict[asyncio.Task[None], ConsumerRecord] = {}
        self._sending_back: set[asyncio.Task[None]] = set()
        self._slot_free = asyncio.Event()
        # A handler may offer a BatchHook, awaited with each batch before its handlers
        # start (ferry.idempotence's Redis claim takes a batch's claims so).
        self._hook = batch_hook(handler)

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
                if self._hook is not None and batch:
                    await self._prepared(self._hook, batch)
                    continue
                for tq, records in batch.items():
                    for record in records:
                        self._start(tq, record)
        except asyncio.CancelledError:
            await self._abandon()
            raise

    async def _prepared(self, hook: BatchHook,
                        batch: dict[TopicQueue, list[ConsumerRecord]]) -> None:
        """Let the handler's hook see the whole batch (an idempotence check takes its
        claims in one call), then start the handlers. The records are held pending
        first, so no commit passes them while `prepare` runs; if the run is cancelled
        or the consumer stops meanwhile, none starts: the hook forgets them (releasing
        what it took) and they are handed out again."""
        records = [r for rs in batch.values() for r in rs]
        for tq, rs in batch.items():
            for record in rs:
                self.pending.add(tq, record.queue_offset)
        try:
            await hook.prepare(records)
        except asyncio.CancelledError:
            await self._unstarted(hook, batch, records)
            raise
        if not self.consumer.started:   # stop() came while prepare ran: too late to start
            await self._unstarted(hook, batch, records)
            return
        for tq, rs in batch.items():
            for record in rs:
                self._start(tq, record, held=True)

    async def _unstarted(self, hook: BatchHook, batch: dict[TopicQueue, list[ConsumerRecord]],
                         records: list[ConsumerRecord]) -> None:
        hook.forget(records)
        for tq, rs in batch.items():
            for record in rs:
                self.pending.discard(tq, record.queue_offset)
        for tq, rs in batch.items():
            await self.consumer.rewind(tq, min(r.queue_offset for r in rs))

    def _start(self, tq: TopicQueue, record: ConsumerRecord, held: bool = False) -> None:
        # Held before the next getmany() promotes the position: commits stop below it.
        if not held:
            self.pending.add(tq, record.queue_offset)
        task = asyncio.get_running_loop().create_task(self._handle(tq, record))
        self.running[task] = (tq, record.queue_offset)
        self.records[task] = record
        self.deadlines.arm(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self.running.pop(task, None)
        self.records.pop(task, None)
        self.deadlines.forget(task)
        self._slot_free.set()

    async def _handle(self, tq: TopicQueue, record: ConsumerRecord) -> None:
        try:
            await self.handler(record)
        except asyncio.CancelledError:
            raise   # not finished: stays pending, so it is not committed
        except Exception as exc:
            if self.deadlines.disarm(asyncio.current_task()):
                return ignore_late(record, exc)   # sent back at its timeout already
            log.warning("handler failed on %s (%s offset %d, attempt %d): %r; nacking",
                        record.msg_id, tq, record.queue_offset, record.reconsume_times, exc)
            try:
                await self.consumer.nack(record)
            except Exception as nack_exc:   # stopped meanwhile: left pending, redelivered
                log.warning("nack of %s not stored: %s", record.msg_id, nack_exc)
                return
        else:
            if self.deadlines.disarm(asyncio.current_task()):
                return ignore_late(record, None)
        self.pending.discard(tq, record.queue_offset)

    def _expire(self, task: asyncio.Task[None]) -> None:
        """`task`'s handler ran past the consume timeout: free its slot, cancel it, and send
        its record back (its position stays pending until the broker stored the copy)."""
        tq, _ = self.running.pop(task)
        record = self.records.pop(task)
        self._slot_free.set()
        task.cancel()
        log.warning("handler on %s (%s offset %d, attempt %d) ran past the consume timeout "
                    "(%.0f ms); sending it back", record.msg_id, tq, record.queue_offset,
                    record.reconsume_times, (self.deadlines.timeout_s or 0) * 1000)
        back = asyncio.get_running_loop().create_task(self._send_back(tq, record))
        self._sending_back.add(back)
        back.add_done_callback(self._sending_back.discard)

    async def _send_back(self, tq: TopicQueue, record: ConsumerRecord) -> None:
        try:
            await self.consumer.nack(record)
        except Exception as exc:   # stopped meanwhile: left pending, redelivered
            log.warning("nack of %s (timed out) not stored: %s", record.msg_id, exc)
            return
        self.pending.discard(tq, record.queue_offset)

    async def wind_down(self, grace_ms: int = RUN_STOP_GRACE_MS) -> None:
        """Let running handlers finish for up to `grace_ms`, then cancel the rest."""
        tasks = list(self.running)
        if tasks:
            await asyncio.wait(tasks, timeout=grace_ms / 1000)
        for task in list(self.running):
            self.deadlines.disarm(task)   # cancelled here: not sent back by a timeout too
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


class OrderedRunner(Runner):
    """`run(handler, ordered=True)`: one record per queue at a time, in offset order.

    One worker task per queue with records: it takes one record, runs the
    handler until the record is done, then the next (at most `MAX_BURST` in a
    row, then it lets other queues have its slot). A handler that raises is
    called again with the same record (`reconsume_times` + 1) after
    `suspend_ms`, in place: the queue waits, other queues go on. Past the
    group's `max_reconsume_times` the record goes to `%DLQ%<group>` (a
    SEND_BACK with `reconsume_times` = the limit + 1) and the queue moves on.
    A queue waiting out its suspend holds no slot of `concurrency`. When the
    queue stops being served (lost, its lock lapsed, the consumer stopping)
    a failing record is not tried again here: it stays uncommitted for whoever
    serves the queue next.
    """

    def __init__(self, consumer: RunnerHost, handler: Handler, concurrency: int,
                 pending: PendingOffsets, *, queues: OrderedQueues,
                 fetchers: dict[TopicQueue, QueueFetcher], consumed: dict[TopicQueue, int],
                 wakeup: asyncio.Event, nacker: Nacker, suspend_ms: int,
                 consume_timeout_s: float | None = None) -> None:
        super().__init__(consumer, handler, concurrency, pending, consume_timeout_s)
        self.queues = queues
        self.fetchers = fetchers     # the consumer's own dicts, shared
        self.consumed = consumed
        self.wakeup = wakeup
        self.nacker = nacker
        self.suspend_ms = suspend_ms
        self.workers: dict[TopicQueue, asyncio.Task[None]] = {}
        self.inflight: dict[TopicQueue, int] = {}   # the offset each queue's handler is on
        self._busy = 0                              # workers not waiting out a suspend
        self._turn = 0

    async def run(self) -> None:
        try:
            while self.consumer.started:
                self.wakeup.clear()
                self._dispatch()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_POLL_MS / 1000):
                        await self.wakeup.wait()   # records arrived, or a worker ended
        except asyncio.CancelledError:
            await self._abandon()
            raise

    def _dispatch(self) -> None:
        """Start a worker on each served queue with records and none yet, up to `concurrency`."""
        ready = []
        for tq, fetcher in self.fetchers.items():
            if tq in self.workers or not self.queues.serving(tq, fetcher):
                continue
            self.consumed[tq] = fetcher.delivered   # idle: past what it skipped (filters) too
            if fetcher.buffered:
                ready.append((tq, fetcher))
        if not ready:
            return
        self._turn = (self._turn + 1) % len(ready)   # a fair start among the ready queues
        for tq, fetcher in ready[self._turn:] + ready[:self._turn]:
            if self._busy >= self.concurrency:
                break
            task = asyncio.get_running_loop().create_task(self._work(tq, fetcher),
                                                          name=f"ordered-{tq}")
            self._busy += 1
            self.workers[tq] = task
            self.running[task] = (tq, fetcher.delivered)
            task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        tq, _ = self.running.pop(task)
        self.workers.pop(tq, None)
        self._busy -= 1
        self._slot_free.set()
        self.wakeup.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("ordered worker of %s failed", tq, exc_info=task.exception())

    async def _work(self, tq: TopicQueue, fetcher: QueueFetcher) -> None:
        for _ in range(MAX_BURST):
            if not fetcher.buffered or not self.queues.serving(tq, fetcher):
                return
            records = fetcher.take(1)
            self.consumer.note_received(tq, records)
            record = records[0]
            offset = record.queue_offset
            self.inflight[tq] = offset
            self.pending.add(tq, offset)   # commits stop below it until it is done
            done = await self._consume(tq, fetcher, record)   # cancelled: stays pending
            del self.inflight[tq]
            if done:   # the position first, then the pending mark: a release commits it
                # `delivered` is past `offset` unless the fetcher went back meanwhile (a
                # replaced history, issue 16): then the position stays back there.
                self.consumed[tq] = fetcher.delivered
                self.pending.discard(tq, offset)
                continue
            if not self.consumer.started:
                return   # stays pending: stop() commits below it, it comes again
            self.pending.discard(tq, offset)
            if self.fetchers.get(tq) is fetcher:   # lock back meanwhile: hand it out again
                await self.consumer.rewind(tq, offset)
            return

    async def _consume(self, tq: TopicQueue, fetcher: QueueFetcher,
                       record: ConsumerRecord) -> bool:
        """Run the handler until `record` is done (True) or the queue is not served (False)."""
        attempt = record
        while True:
            try:
                await call_within(self.handler, attempt, self.deadlines.timeout_s)
                return True
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                limit = self.nacker.policy.max_reconsume_times
                if attempt.reconsume_times >= limit:
                    return await self._dead_letter(tq, attempt, limit, exc)
                log.warning("handler failed on %s (%s offset %d, attempt %d): %r; trying again "
                            "in %d ms", attempt.msg_id, tq, attempt.queue_offset,
                            attempt.reconsume_times, exc, self.suspend_ms)
            self._busy -= 1   # a suspended queue holds no slot
            self._slot_free.set()
            self.wakeup.set()
            try:
                await asyncio.sleep(self.suspend_ms / 1000)
                if not self.queues.serving(tq, fetcher):
                    return False
                while self._busy >= self.concurrency:
                    self._slot_free.clear()
                    await self._slot_free.wait()
            finally:
                self._busy += 1
            attempt = attempt.with_reconsume_times(attempt.reconsume_times + 1)

    async def _dead_letter(self, tq: TopicQueue, record: ConsumerRecord, limit: int,
                           exc: Exception) -> bool:
        """SEND_BACK past the limit: the broker stores it in `%DLQ%<group>`. False if stopped.

        Broadcasting groups have no dead-letter queue: the record is dropped (logged).
        """
        if self.consumer.mode == "broadcasting":
            log.warning("handler failed on %s (%s offset %d) %d times: %r; dropped "
                        "(broadcasting groups do not retry)", record.msg_id, tq,
                        record.queue_offset, record.reconsume_times + 1, exc)
            return True
        log.warning("handler failed on %s (%s offset %d) %d times: %r; sending it to the "
                    "dead-letter queue", record.msg_id, tq, record.queue_offset,
                    record.reconsume_times + 1, exc)
        try:
            await self.nacker.send_back.send(record, reconsume_times=limit + 1, delay_ms=0,
                                             max_reconsume_times=limit)
        except FerryError as send_exc:   # the consumer stopped first
            log.warning("dead-lettering of %s not stored: %s", record.msg_id, send_exc)
            return False
        return True

    async def _abandon(self) -> None:
        """Cancel the workers and rewind their queues to the record each was on."""
        unfinished = dict(self.inflight)
        await self.wind_down(grace_ms=0)
        for tq, offset in unfinished.items():
            self.pending.discard(tq, offset)
            await self.consumer.rewind(tq, offset)


"""The producer's sender: one accumulator per queue, the SEND request, its retries, failover.

A `Producer` owns one `Sender` (as nats.py's client owns its writer): the
producer chooses a queue and queues an entry there (`add`); the sender batches
each queue's entries (`accumulator.QueueBatcher`) and sends the batches.

A retriable failure (the broker died, timed out, is busy or not master) puts
its broker on a skip list for `broker_backoff_ms` and refreshes the route.
Plain messages are then sent again to a queue on another broker; ordered ones
(`ordered=True` with a key or a queue selector) are sent again to the SAME
queue after `retry_backoff_ms`, holding the queue's only in-flight slot so
that nothing sent later overtakes them, and fail once `retries` are spent:
a key is never moved by a failure (RocketMQ's orderly semantics). Delivery is
at-least-once: a message whose ack was lost may be stored twice.

Failover (see docs/replication.md "Client behaviour"): a broker group whose
master answers NotMasterError (it is a slave now, or lost its lease),
SlaveNotAvailableError (sync replication timed out) or drops the connection
makes the producer refresh the topic's route (rate-limited, see `namesrv`) and
send the retry to the group's master in the new route; while the route names
no master for the group (the election is under way) a send to it fails with
NotMasterError and is retried after `retry_backoff_ms`. All of this counts
against `retries`: to ride out a failover of a few seconds, give the producer
`retries * retry_backoff_ms` above the brokers' `election_ttl_s`.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, cast

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import Message, SendResult, TopicQueue
from ferry.client.core.metrics import SendMetrics
from ferry.client.core.namesrv import RouteCache
from ferry.client.producing.accumulator import MAX_BATCH_MESSAGES, Batch, QueueBatcher
from ferry.client.producing.buffer import ByteBudget
from ferry.client.producing.encoding import check_body, encode_group, to_wire
from ferry.client.producing.pending import (
    Entry,
    Pending,
    PendingGroup,
    PendingMessage,
    complete,
    entries_body,
    live_entries,
    split_entries,
)
from ferry.client.producing.queues import QueueChooser, QueueSelector, pinned
from ferry.errors import FerryError, NotMasterError, SystemError_, TopicNotFoundError
from ferry.wire import Frame, RequestCode

# The producer's logger: these lines were, and still read as, the producer's.
log = logging.getLogger("ferry.client.producing.producer")

_DROP_LOG_INTERVAL_S = 1.0
# What a queued one-way send costs beyond its bytes (its task and coroutine frame), so
# that the buffer bound also bounds the number of one-way tasks.
ONEWAY_OVERHEAD_BYTES = 1024


class Sender:
    """Batches and sends a producer's entries, and retries or fails them."""

    def __init__(self, routes: RouteCache, pool: ConnectionPool, budget: ByteBudget,
                 chooser: QueueChooser, *, linger_ms: int, max_batch_bytes: int,
                 max_in_flight_per_queue: int, retries: int, retry_backoff_ms: int,
                 max_block_ms: int, max_delay_ms: int) -> None:
        self.routes = routes
        self.pool = pool
        self.budget = budget
        self.chooser = chooser
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.max_in_flight_per_queue = max_in_flight_per_queue
        self.retries = retries
        self.retry_backoff_ms = retry_backoff_ms
        self.max_block_ms = max_block_ms
        self.max_delay_ms = max_delay_ms
        self.batchers: dict[TopicQueue, QueueBatcher] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self._oneway_dropped = 0
        self._oneway_drop_logged = 0.0
        self.metrics = SendMetrics()

    # -- queueing -----------------------------------------------------------------------------
    def batcher(self, tq: TopicQueue) -> QueueBatcher:
        """The accumulator of `tq` (made at its first entry)."""
        batcher = self.batchers.get(tq)
        if batcher is None:
            async def send(batch: Batch, tq: TopicQueue = tq) -> None:
                await self.send_batch(tq, batch)
            batcher = QueueBatcher(send, linger_ms=self.linger_ms,
                                   max_batch_bytes=self.max_batch_bytes,
                                   max_in_flight=self.max_in_flight_per_queue)
            self.batchers[tq] = batcher
        return batcher

    def add(self, tq: TopicQueue, item: Pending) -> None:
        """Queue `item` on `tq`; a queue that carries ordered messages keeps one batch in flight."""
        batcher = self.batcher(tq)
        if item.ordered:
            batcher.max_in_flight = 1
        batcher.add(item, item.flags)

    async def place(self, item: Pending, choose: Callable[[], TopicQueue]) -> None:
        """Take `item`'s bytes from the budget (waiting up to `max_block_ms`, then BusyError),
        then queue it on the queue `choose()` names (a failure there gives the bytes back)."""
        nbytes = item.size_bytes
        budget = self.budget
        if budget.used_bytes + nbytes > budget.limit_bytes or budget.waiters:
            await budget.take(nbytes, self.max_block_ms)
        else:
            budget.used_bytes += nbytes
        try:
            tq = choose()
        except BaseException:
            budget.release(nbytes)
            raise
        self.add(tq, item)

    async def send_group(self, topic: str, messages: Sequence[Message], ordered: bool,
                         selector: QueueSelector | None) -> list[SendResult]:
        """`Producer.send_batch`'s messages (checked), to one queue chosen by the first one.

        They are encoded once, here, and wait as one entry with one future; a batch
        over `max_batch_bytes` goes as one entry per message, still to that queue.
        """
        msg_ids, parts, nbytes, flags = encode_group(messages, self.max_delay_ms)
        first = messages[0]
        route = self.routes.fresh(topic) or await self.routes.route(topic)
        if nbytes > self.max_batch_bytes or len(msg_ids) > MAX_BATCH_MESSAGES:
            tq = self.chooser.choose(topic, route, first, ordered, selector)
            loop = asyncio.get_running_loop()
            items = []
            for msg in messages:
                check_body(msg.body)
                items.append(PendingMessage(wire=to_wire(msg, self.max_delay_ms),
                                            future=loop.create_future(),
                                            topic=topic, key=msg.key,
                                            ordered=pinned(ordered, msg.key, selector),
                                            priority=msg.priority))
            for item in items:
                await self.place(item, lambda: tq)
            return cast(list[SendResult], await asyncio.gather(*(it.future for it in items)))
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        group = PendingGroup(msg_ids=msg_ids, encoded=b"", parts=parts, nbytes=nbytes,
                             future=fut, topic=topic, first_body=bytes(first.body),
                             key=first.key, ordered=pinned(ordered, first.key, selector),
                             flags=flags, priority=first.priority)
        await self.place(group, lambda: self.chooser.choose(topic, route, first, ordered,
                                                             selector))
        results: list[SendResult] = await fut
        return results

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task that `flush` waits for."""
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def flush(self) -> None:
        """Wait until every entry queued so far is acknowledged or failed."""
        while self.tasks or any(b.pending or b.in_flight for b in self.batchers.values()):
            await asyncio.gather(*(b.flush() for b in list(self.batchers.values())),
                                 *list(self.tasks), return_exceptions=True)

    # -- one batch ----------------------------------------------------------------------------
    async def send_batch(self, tq: TopicQueue, batch: Batch) -> None:
        """Send one batch; retry ordered messages here, hand the others to other brokers."""
        moved = 0   # bytes handed to other queues: their new batches release them
        try:
            items: list[Entry] = live_entries(batch.items)
            refresh = False
            while items:
                addr = None
                started = 0.0
                try:
                    addr = await self._target(tq, refresh)
                    started = time.monotonic()
                    resp = await self._request(tq, addr, items, batch.flags)
                except FerryError as exc:
                    if started:
                        self.metrics.sent(tq.topic, sum(it.count for it in items),
                                          time.monotonic() - started, type(exc).__name__)
                    again, moved_now = self._on_failure(tq, split_entries(items, tq.topic), exc,
                                                        addr)
                    items = list(again)
                    moved += moved_now
                    if items:
                        await asyncio.sleep(self.retry_backoff_ms / 1000)
                        refresh = True
                    continue
                except Exception as exc:  # a bug must not leave futures pending forever
                    log.exception("send to %s failed unexpectedly", tq)
                    self._on_failure(tq, split_entries(items, tq.topic),
                                     SystemError_(f"unexpected client error: {exc!r}"))
                    return
                self.metrics.sent(tq.topic, sum(it.count for it in items),
                                  time.monotonic() - started)
                complete(tq, items, resp.fields)
                return
        finally:
            self.budget.release(batch.size_bytes - moved)

    async def _target(self, tq: TopicQueue, refresh: bool) -> str:
        """The master of `tq`'s broker group (from a refreshed route on a retry)."""
        if refresh:
            route = await self.routes.route(tq.topic)
        else:
            route = self.routes.cached(tq.topic) or await self.routes.route(tq.topic)
        addr = route.broker_addr(tq.broker)
        if addr is None:
            if route.broker(tq.broker) is not None:   # in the route, masterless: failing over
                raise NotMasterError(f"broker group {tq.broker} has no master now "
                                     f"(failing over); {tq.topic} waits for the new one")
            raise TopicNotFoundError(f"broker {tq.broker} has no live master for {tq.topic}")
        return addr

    async def _request(self, tq: TopicQueue, addr: str, items: list[Entry],
                       flags: int) -> Frame:
        body = entries_body(items)
        fields = {"topic": tq.topic, "queue_id": tq.queue_id}
        if flags:   # the broker runs its before-put hooks only for a flagged SEND
            fields["flags"] = flags
        return await self.pool.request(addr, RequestCode.SEND, fields, body)

    # -- failures -----------------------------------------------------------------------------
    def _on_failure(self, tq: TopicQueue, items: list[Pending], exc: FerryError,
                    addr: str | None = None) -> tuple[list[Pending], int]:
        """Fail, or schedule again, the items of a failed SEND (to `addr`, if it got that far).

        Returns the ordered items to send again to `tq` (by the caller, which
        holds the queue's in-flight slot) and the bytes handed to other queues.
        """
        if not exc.retriable:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return [], 0
        # Skipped while the route names the master that failed; a new master is used at once.
        self.chooser.mark_faulty(tq.broker, addr)
        self.routes.invalidate(tq.topic)
        here: list[Pending] = []
        elsewhere: list[Pending] = []
        for it in items:
            it.attempts += 1
            if it.future.done():
                continue
            if it.attempts > self.retries:
                it.future.set_exception(exc)
            elif it.ordered:
                here.append(it)
            else:
                elsewhere.append(it)
        log.info("send to %s failed (%s); %d to retry on this queue, %d elsewhere",
                 tq, exc, len(here), len(elsewhere))
        moved = 0
        if elsewhere:
            moved = sum(it.size_bytes for it in elsewhere)
            self.spawn(self._resubmit(tq.topic, elsewhere))
        return here, moved

    async def _resubmit(self, topic: str, items: list[Pending]) -> None:
        """Queue plain messages again on healthy queues; a failure here fails them.

        While no broker group of the topic has a master (a failover under way),
        the items wait `retry_backoff_ms` for a new route, each wait counting as
        an attempt against `retries`; when every group's master just failed,
        they pause `retry_backoff_ms` before trying again.
        """
        rest = list(items)
        try:
            while rest:
                route = await self.routes.route(topic)
                try:
                    if self.chooser.all_skipped(topic, route, rest[0].priority):
                        # Every group's master just failed: pause (the route may name a new
                        # master by then), then try them anyway; no spinning on a dead one.
                        await asyncio.sleep(self.retry_backoff_ms / 1000)
                        route = await self.routes.route(topic)
                    while rest:
                        self.add(self.chooser.round_robin(topic, route, rest[0].priority),
                                 rest[0])
                        rest.pop(0)
                except NotMasterError as exc:
                    rest = self._give_up_spent(rest, exc)
                    self.routes.invalidate(topic)
                    await asyncio.sleep(self.retry_backoff_ms / 1000)
        except Exception as exc:
            err = exc if isinstance(exc, FerryError) else \
                SystemError_(f"unexpected client error: {exc!r}")
            if not isinstance(exc, FerryError):
                log.exception("resending to %s failed unexpectedly", topic)
            self.budget.release(sum(it.size_bytes for it in rest))
            for it in rest:
                if not it.future.done():
                    it.future.set_exception(err)

    def _give_up_spent(self, items: list[Pending], exc: FerryError) -> list[Pending]:
        """Count one more attempt on each item; fail (and release) those past `retries`."""
        keep = []
        for it in items:
            it.attempts += 1
            if it.attempts > self.retries or it.future.done():
                self.budget.release(it.size_bytes)
                if not it.future.done():
                    it.future.set_exception(exc)
            else:
                keep.append(it)
        return keep

    # -- one-way ------------------------------------------------------------------------------
    def send_oneway(self, topic: str, encoded: bytes) -> bool:
        """Send one encoded message, unacknowledged, holding its size (and a task's) of the
        budget meanwhile; False (a rate-limited warning) when the budget is full: a one-way
        send never waits."""
        size = len(encoded) + ONEWAY_OVERHEAD_BYTES
        if not self.budget.try_take(size):
            self._note_oneway_drop(topic)
            return False
        self.spawn(self._oneway(topic, encoded, size))
        return True

    def _note_oneway_drop(self, topic: str) -> None:
        self._oneway_dropped += 1
        now = time.monotonic()
        if now - self._oneway_drop_logged >= _DROP_LOG_INTERVAL_S:
            self._oneway_drop_logged = now
            log.warning("producer buffer full (%d bytes): dropped %d one-way message(s), "
                        "the last to %s", self.budget.limit_bytes, self._oneway_dropped, topic)
            self._oneway_dropped = 0

    async def _oneway(self, topic: str, encoded: bytes, size: int) -> None:
        try:
            route = await self.routes.route(topic)
            tq = self.chooser.round_robin(topic, route)
            addr = route.broker_addr(tq.broker)
            if addr is None:
                raise TopicNotFoundError(f"broker {tq.broker} of {topic} has no master")
            conn = await self.pool.get(addr)
            await conn.drain()   # a slow broker holds one-way sends here, inside the budget
            conn.send_oneway(RequestCode.SEND, {"topic": topic, "queue_id": tq.queue_id},
                             encoded)
        except FerryError as exc:
            log.warning("one-way send to %s dropped: %s", topic, exc)
        finally:
            self.budget.release(size)

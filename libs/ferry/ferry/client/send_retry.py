"""The part of `Producer` that sends a batch: the SEND request, its retries, failover.

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

`SendRetries` works on the producer's own state, declared here (as
`Positions` does for `Consumer`): a mixin rather than a collaborator so that
the per-batch path reads the producer's parts directly, with no extra
lookups, and a part replaced on the producer is the one used.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ferry.client.accumulator import Batch, Entry, Pending
from ferry.client.buffer import ByteBudget
from ferry.client.connection import ConnectionPool
from ferry.client.encoding import complete, entries_body, live_entries, split_runs
from ferry.client.message import TopicQueue
from ferry.client.namesrv import RouteCache
from ferry.client.queues import QueueChooser
from ferry.errors import FerryError, NotMasterError, SystemError_, TopicNotFoundError
from ferry.wire import Frame, RequestCode

# The producer's logger: these lines were, and still read as, the producer's.
log = logging.getLogger("ferry.client.producer")


class SendRetries:
    """Sends the producer's batches and handles their failures (mixed into `Producer`)."""

    retries: int
    retry_backoff_ms: int
    _routes: RouteCache
    _pool: ConnectionPool
    _budget: ByteBudget
    _chooser: QueueChooser
    _tasks: set[asyncio.Task[Any]]

    _add: Callable[[TopicQueue, Pending], None]   # the producer's: queue `item` on `tq`

    async def _send_batch(self, tq: TopicQueue, batch: Batch) -> None:
        """Send one batch; retry ordered messages here, hand the others to other brokers."""
        moved = 0   # bytes handed to other queues: their new batches release them
        try:
            items: list[Entry] = live_entries(batch.items)
            refresh = False
            while items:
                addr = None
                try:
                    addr = await self._target(tq, refresh)
                    resp = await self._request(tq, addr, items, batch.flags)
                except FerryError as exc:
                    again, moved_now = self._on_failure(tq, split_runs(items, tq.topic), exc,
                                                        addr)
                    items = list(again)
                    moved += moved_now
                    if items:
                        await asyncio.sleep(self.retry_backoff_ms / 1000)
                        refresh = True
                    continue
                except Exception as exc:  # a bug must not leave futures pending forever
                    log.exception("send to %s failed unexpectedly", tq)
                    self._on_failure(tq, split_runs(items, tq.topic),
                                     SystemError_(f"unexpected client error: {exc!r}"))
                    return
                complete(tq, items, resp)
                return
        finally:
            self._budget.release(batch.size_bytes - moved)

    async def _target(self, tq: TopicQueue, refresh: bool) -> str:
        """The master of `tq`'s broker group (from a refreshed route on a retry)."""
        if refresh:
            route = await self._routes.route(tq.topic)
        else:
            route = self._routes.cached(tq.topic) or await self._routes.route(tq.topic)
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
        return await self._pool.request(addr, RequestCode.SEND, fields, body)

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
        self._chooser.mark_faulty(tq.broker, addr)
        self._routes.invalidate(tq.topic)
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
            task = asyncio.get_running_loop().create_task(self._resubmit(tq.topic, elsewhere))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
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
                route = await self._routes.route(topic)
                try:
                    if self._chooser.all_skipped(topic, route, rest[0].priority):
                        # Every group's master just failed: pause (the route may name a new
                        # master by then), then try them anyway; no spinning on a dead one.
                        await asyncio.sleep(self.retry_backoff_ms / 1000)
                        route = await self._routes.route(topic)
                    while rest:
                        self._add(self._chooser.round_robin(topic, route, rest[0].priority),
                                  rest[0])
                        rest.pop(0)
                except NotMasterError as exc:
                    rest = self._give_up_spent(rest, exc)
                    self._routes.invalidate(topic)
                    await asyncio.sleep(self.retry_backoff_ms / 1000)
        except Exception as exc:
            err = exc if isinstance(exc, FerryError) else \
                SystemError_(f"unexpected client error: {exc!r}")
            if not isinstance(exc, FerryError):
                log.exception("resending to %s failed unexpectedly", topic)
            self._budget.release(sum(it.size_bytes for it in rest))
            for it in rest:
                if not it.future.done():
                    it.future.set_exception(err)

    def _give_up_spent(self, items: list[Pending], exc: FerryError) -> list[Pending]:
        """Count one more attempt on each item; fail (and release) those past `retries`."""
        keep = []
        for it in items:
            it.attempts += 1
            if it.attempts > self.retries or it.future.done():
                self._budget.release(it.size_bytes)
                if not it.future.done():
                    it.future.set_exception(exc)
            else:
                keep.append(it)
        return keep

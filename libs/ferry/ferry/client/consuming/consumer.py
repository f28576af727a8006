"""The asyncio Consumer: group membership, rebalance, per-queue fetchers, offsets.

`async for rec in consumer` yields records one by one; `getmany()` returns a
dict `{TopicQueue: [ConsumerRecord, ...]}` (the aiokafka shape). Positions are
at-least-once: records handed out count as consumed once the application asks
for more (the next `getmany()` / iteration step) or calls `commit()`; only
consumed positions are auto-committed, so a crash re-delivers what was being
processed instead of losing it.

Clustering: every `heartbeat_interval_ms` a HEARTBEAT goes to each broker of
the subscribed topics, and every `rebalance_interval_ms` (and at start) the
member list (GET_CONSUMERS) is allocated (see `allocation`: average by default). A lost
queue is committed and its fetcher stopped; a gained one starts from the
group's committed offset, else from `auto_offset_reset` (when not given: the
group's `consume_from` in its namesrv config, else latest; see
`group_settings`). Broadcasting: every
queue, positions kept locally (`offset_store_path` to keep them across runs).

Retries (clustering): the consumer also subscribes to its group's retry topic
`%RETRY%<group>` (whose route appears once a broker stored a retry; until then
it is looked for again on each rebalance, quietly). Its records are shown with
the topic they were first consumed from (`record.topic`; `record.stored_topic`
is the retry topic) and count their redeliveries in `reconsume_times`.
`nack(record)` sends a record back (see `retry`); `run(handler)` is the push
style (see `runner`). No position is committed past a record whose nack is
not yet stored or whose `run` handler has not finished. Broadcasting groups do
not retry: `nack` logs the failure and drops it (RocketMQ's behaviour).

Ordered (`ordered=True`, or `run(handler, ordered=True)`): queues are served
only while locked at their broker, released only at a committed position, and
`run` takes one record per queue at a time (see `ordered` and `runner`).

Subscriptions (`subscription=`, see `subscriptions`): a tag expression, an
`Sql(...)` selector, or a dict of them per topic, filtered at the broker;
compiled at `start()`, where a bad expression raises InvalidFilterError. The
HEARTBEAT carries them so the broker can warn about members that differ.
`allocation=` picks the strategy of `allocation` ("average" or
"consistent_hash"). On a topic with priority levels, buffered records of a
higher level are handed out before any of a lower level of the same broker.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.consuming.allocation import allocator
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher, servable
from ferry.client.consuming.group_settings import RESETS, GroupSettings
from ferry.client.consuming.idempotence_hook import wire_idempotence
from ferry.client.consuming.ordered import OrderedQueues
from ferry.client.consuming.positions import Positions
from ferry.client.consuming.rebalance import GroupMembership, broadcasting_assignment, periodically
from ferry.client.consuming.retry import Nacker, PendingOffsets, SendBack
from ferry.client.consuming.runner import RUN_STOP_GRACE_MS, OrderedRunner, Runner
from ferry.client.consuming.subscriptions import Spec, compile_subscriptions, subscription_specs
from ferry.client.core.base import AsyncClient
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache, TopicRoute, default_namesrv
from ferry.client.core.offsets import (
    LocalOffsetStore,
    OffsetStore,
    RemoteOffsetStore,
)
from ferry.client.core.tracing import trace_received, traced_handler
from ferry.errors import FerryError
from ferry.names import retry_topic, validate_group, validate_topic
from ferry.telemetry import client_service_name, setup_tracing, tracing

log = logging.getLogger(__name__)

MODES = ("clustering", "broadcasting")


class Consumer(Positions, AsyncClient):
    """Consumes topics as a member of `group`. Use `async with Consumer(...) as c:`."""

    def __init__(self, *topics: str, group: str, namesrv: str | None = None,
                 mode: str = "clustering", auto_offset_reset: str | None = None,
                 enable_auto_commit: bool = True, auto_commit_interval_ms: int = 5_000,
                 max_poll_records: int = 500, prefetch_records_per_queue: int = 1_000,
                 pull_batch_size: int = 256, pull_max_wait_ms: int = 15_000,
                 request_timeout_ms: int = 30_000, heartbeat_interval_ms: int = 5_000,
                 rebalance_interval_ms: int = 5_000, tags: str | Iterable[str] | None = None,
                 offset_store_path: str | os.PathLike[str] | None = None,
                 client_id: str | None = None, route_refresh_interval_ms: int = 30_000,
                 max_reconsume_times: int | None = None,
                 retry_backoff_ms: Sequence[int] | None = None,
                 subscription: Spec | Mapping[str, Spec] = None,
                 allocation: str = "average", ordered: bool = False,
                 suspend_ms: int = 1_000, lock_renew_interval_ms: int = 20_000,
                 credentials: Credentials | None = None) -> None:
        if not topics:
            raise ValueError("subscribe to at least one topic")
        if mode not in MODES or (auto_offset_reset is not None
                                 and auto_offset_reset not in RESETS):
            raise ValueError(f"mode must be one of {MODES}, auto_offset_reset one of {RESETS}")
        if request_timeout_ms <= pull_max_wait_ms:
            raise ValueError("request_timeout_ms must exceed pull_max_wait_ms (long polling)")
        self.topics = [validate_topic(t, allow_internal=True) for t in topics]
        self.group = validate_group(group)
        self.mode = mode
        self.allocation = allocation
        self._specs = subscription_specs(self.topics, subscription, tags)
        # What is pulled: the topics, and in clustering mode the group's retry topic.
        self._subscribed = list(self.topics)
        if mode == "clustering" and retry_topic(self.group) not in self._subscribed:
            self._subscribed.append(retry_topic(self.group))
        self.enable_auto_commit = enable_auto_commit
        self.auto_commit_interval_ms = auto_commit_interval_ms
        self.max_poll_records = max_poll_records
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.client_id = client_id or f"{socket.gethostname()}@{os.getpid()}@{secrets.token_hex(4)}"
        self._namesrv_addr = namesrv or default_namesrv()
        # Every request is signed with these (default: FERRY_ACCESS_KEY/FERRY_SECRET_KEY).
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self._namesrv = NamesrvClient(self._namesrv_addr, credentials=self.credentials)
        self._tracing = tracing()
        self._routes = RouteCache(self._namesrv, refresh_interval_ms=route_refresh_interval_ms)
        # Long polls wait up to request_timeout_ms (passed per PULL); every other request
        # (heartbeats, offsets, members) gives up sooner so a hung broker cannot stall
        # the rebalance loop for long.
        self._pool = ConnectionPool(request_timeout_ms=min(10_000, request_timeout_ms),
                                    credentials=self.credentials)
        self._fetch_config = FetchConfig(
            group=self.group, max_count=pull_batch_size, max_wait_ms=pull_max_wait_ms,
            request_timeout_ms=request_timeout_ms, prefetch_records=prefetch_records_per_queue)
        self._members = GroupMembership(self._pool, self._routes, client_id=self.client_id,
                                        group=self.group, topics=self._subscribed, mode=mode,
                                        allocate=allocator(allocation))
        self._levels: dict[TopicQueue, int] = {}   # priority level of queues above level 0
        self._offsets: OffsetStore = (
            RemoteOffsetStore(self._pool, self._routes, self.group, self._commit_addr)
            if mode == "clustering" else LocalOffsetStore(offset_store_path))
        self._fetchers: dict[TopicQueue, QueueFetcher] = {}
        self._consumed: dict[TopicQueue, int] = {}
        self._committed: dict[TopicQueue, int] = {}
        self._wakeup = asyncio.Event()
        self._rebalance_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._next_queue = 0
        self._routes_seen: dict[str, TopicRoute] = {}
        self._pending = PendingOffsets()
        self._nacker = Nacker(SendBack(self._pool, self._routes, self.group,
                                       self._routes_seen.values),
                              self._pending, max_reconsume_times=max_reconsume_times,
                              retry_backoff_ms=retry_backoff_ms)
        # None: the group's consume_from decides, read at start
        self._settings = GroupSettings(self._namesrv, self.group, auto_offset_reset, self._nacker)
        self._runners: set[Runner] = set()
        #: What `run(..., idempotence=...)` did (None until such a run starts).
        #: A `ferry.idempotence.IdempotenceStats`.
        self.idempotence_stats: Any = None
        self._started = False
        # Ordered consumption (see `ordered`): its queue locks, when on.
        if suspend_ms < 0 or lock_renew_interval_ms <= 0:
            raise ValueError("suspend_ms must be >= 0 and lock_renew_interval_ms > 0")
        self.suspend_ms = suspend_ms
        self.lock_renew_interval_ms = lock_renew_interval_ms
        self._ordered: OrderedQueues | None = OrderedQueues(self) if ordered else None

    @property
    def started(self) -> bool:
        return self._started

    @property
    def auto_offset_reset(self) -> str | None:
        """Where a queue with no committed offset starts (None until the group's config is read)."""
        return self._settings.auto_offset_reset

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._subscribe()   # a bad expression fails here, before any network call
        self._tracing = setup_tracing(client_service_name(), namesrv=self._namesrv_addr)
        await self._namesrv.start()
        if self._settings.auto_offset_reset is None or self.mode == "clustering":
            try:
                await self._settings.load()
            except FerryError as exc:   # namesrv unreachable: asked again before a queue starts
                log.warning("cannot read group %s's config yet: %s", self.group, exc)
        self._started = True
        # Our place in the group's join order (consistent_hash allocation): sent with
        # every heartbeat, fixed from before the first one.
        self._members.joined_ms = int(time.time() * 1000)
        await self._heartbeat_and_rebalance(heartbeat=True)
        loop = asyncio.get_running_loop()
        self._tasks.append(loop.create_task(self._coordinate(), name="ferry-rebalance"))
        if self.enable_auto_commit:
            self._tasks.append(loop.create_task(self._auto_commit(), name="ferry-autocommit"))

    async def stop(self, *, processed: bool = True) -> None:
        """Leave the group: stop fetching, commit, unregister, close connections.

        `processed=False` (used when `async with` exits with an exception) commits
        only positions known consumed, not the records handed out last.
        """
        if not self._started:
            return
        self._started = False
        self._wakeup.set()   # a getmany() waiting in another task returns now
        for runner in list(self._runners):
            await runner.wind_down()
        await self._nacker.close(RUN_STOP_GRACE_MS)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        for fetcher in self._fetchers.values():
            await fetcher.stop()
        if processed:
            self._promote()
        await self._commit_quietly()
        self._fetchers.clear()
        if self.mode == "clustering":
            await self._members.unregister(self._routes_seen.values())
        await self._offsets.close()
        await self._pool.close()
        await self._namesrv.close()

    async def __aexit__(self, exc_type: object = None, *exc: object) -> None:
        await self.stop(processed=exc_type is None)

    # -- reading ----------------------------------------------------------------------------
    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        # getmany(max_records=1) without its timer: nothing here needs a deadline, since
        # stop() sets the wakeup too. One record per call, so the timer and the Event
        # wait it saves are a large part of what iterating costs per message.
        self._promote()
        while True:
            for records in self._take(1).values():
                return records[0]
            if not self._started:
                raise StopAsyncIteration
            self._wakeup.clear()   # no await since the take: nothing was buffered meanwhile
            await self._wakeup.wait()

    async def getmany(self, timeout_ms: int = 0,
                      max_records: int | None = None) -> dict[TopicQueue, list[ConsumerRecord]]:
        """Buffered records by queue, waiting up to `timeout_ms` for the first one."""
        self._promote()
        limit = max_records or self.max_poll_records
        out = self._take(limit)
        if out or timeout_ms <= 0:
            return out
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not out and self._started:
            self._wakeup.clear()
            out = self._take(limit)
            if out:
                break
            remaining = deadline - loop.time()
            if remaining <= 0:
                break
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(remaining):
                    await self._wakeup.wait()
            out = self._take(limit)
        return out

    def _take(self, limit: int) -> dict[TopicQueue, list[ConsumerRecord]]:
        """Round-robin over the queues, so that a busy queue does not starve the others.

        Of a topic with priority levels, only the highest level with buffered
        records on each broker is served; lower levels get the rest of `limit`.
        """
        out: dict[TopicQueue, list[ConsumerRecord]] = {}
        taken = 0
        while taken < limit:
            fetchers = servable(self._fetchers.values(), self._levels)
            if not fetchers:
                break
            self._next_queue = (self._next_queue + 1) % len(fetchers)
            fetchers = fetchers[self._next_queue:] + fetchers[:self._next_queue]
            share = max(1, (limit - taken) // len(fetchers))
            before = taken
            for fetcher in fetchers:
                records = fetcher.take(min(share, limit - taken))
                if records:
                    if fetcher.tq in out:
                        out[fetcher.tq] += records
                    else:
                        out[fetcher.tq] = records
                    taken += len(records)
                if taken >= limit:
                    break
            if taken == before:   # nothing to take after all: never spin
                break
        if out and self._tracing.enabled:
            trace_received(self._tracing, out, self.group)
        return out

    def note_received(self, tq: TopicQueue, records: list[ConsumerRecord]) -> None:
        """`receive` spans for traced records a runner took from a fetcher itself."""
        if self._tracing.enabled:
            trace_received(self._tracing, {tq: records}, self.group)

    # -- outcomes ---------------------------------------------------------------------------
    async def nack(self, record: ConsumerRecord, delay_ms: int | None = None) -> None:
        """Have `record` delivered again later, through the group's retry topic.

        The broker stores a copy with `reconsume_times` + 1 after `delay_ms`
        (default: the back-off of that attempt from the group's retry policy),
        or in `%DLQ%<group>` once past `max_reconsume_times`. Returns when a
        broker stored it; until then no commit passes the record (a failing
        send-back is retried, on other brokers too, until the consumer stops).
        Nack a record before asking for the next ones. Broadcasting mode does
        not retry: the failure is logged and the message dropped.
        """
        if self.mode == "broadcasting":
            log.warning("%s: nack in broadcasting mode drops %s (%s offset %d): broadcasting "
                        "groups do not retry", self.client_id, record.msg_id,
                        record.topic_queue, record.queue_offset)
            return
        if not self._nacker.configured and self._started:   # namesrv was away at start
            with contextlib.suppress(FerryError):
                await self._settings.load()
        await self._nacker.nack(record, delay_ms)

    @property
    def ordered(self) -> bool:
        """True when records are handed out only from queues locked by this member."""
        return self._ordered is not None

    async def run(self, handler: Callable[..., Awaitable[Any]], *, concurrency: int = 1,
                  ordered: bool | None = None, idempotence: object = None) -> None:
        """Push style: call `await handler(record)` for each record, up to `concurrency` at once.

        A handler that returns consumed its record; one that raises has it
        nacked (with the retry policy's back-off). Offsets commit only up to
        the lowest record still in a handler on each queue. Returns once the
        consumer stops (see `runner` for what happens to running handlers).

        Ordered (`ordered=True`, the default of a consumer made with
        `ordered=True`; it turns ordered mode on for one made without): one
        record per queue at a time in offset order, queues in parallel
        (`concurrency` caps the handlers running), a failing record called
        again in place after `suspend_ms`, then dead-lettered (`OrderedRunner`).

        `idempotence`: a RedisClaim, a Ledger, `ledger.transactional(...)` or
        any `wrap(handler)` check around the handler; duplicates are
        acknowledged, counted in `idempotence_stats` (see `ferry.idempotence.wiring`).
        """
        if not self._started:
            raise RuntimeError("the consumer is not started: call start() or use `async with`")
        if idempotence is not None:   # ferry.idempotence's wiring (see idempotence_hook)
            handler, self.idempotence_stats = wire_idempotence(
                handler, idempotence, group=self.group, stats=self.idempotence_stats)
        if self._tracing.enabled:   # outermost: the idempotence check runs inside `process`
            handler = traced_handler(handler, self.group)
        if ordered is False and self._ordered is not None:
            raise ValueError("this consumer is ordered: its run() is ordered too")
        if ordered and self._ordered is None:
            async with self._rebalance_lock:
                self._ordered = OrderedQueues(self)
                await self._ordered.adopt()
        runner: Runner
        if self._ordered is not None:
            if not self._nacker.configured:   # the dead-letter limit is the group's
                with contextlib.suppress(FerryError):
                    await self._settings.load()
            runner = OrderedRunner(self, handler, concurrency, self._pending,
                                   queues=self._ordered, fetchers=self._fetchers,
                                   consumed=self._consumed, wakeup=self._wakeup,
                                   nacker=self._nacker, suspend_ms=self.suspend_ms)
        else:
            runner = Runner(self, handler, concurrency, self._pending)
        self._runners.add(runner)
        try:
            await runner.run()
        finally:
            self._runners.discard(runner)

    async def rewind(self, tq: TopicQueue, offset: int) -> None:
        """Hand out `tq` again from `offset` if it is earlier than this consumer's position.

        The queue's history is kept (issue 16): the records below `offset` were read,
        so a log replaced meanwhile still sends the fetcher back."""
        fetcher = self._fetchers.get(tq)
        if self._started and fetcher is not None and offset < fetcher.delivered:
            await self.seek(tq, offset, keep_hist=True)

    # -- membership and rebalance -----------------------------------------------------------
    def _subscribe(self) -> None:
        """Compile the subscriptions; they go with every PULL and HEARTBEAT."""
        subscriptions = compile_subscriptions(self._specs)
        self._fetch_config.subscribe(subscriptions)
        self._members.subscriptions = {t: s.to_fields() for t, s in subscriptions.items()}

    async def _coordinate(self) -> None:
        await periodically(self.heartbeat_interval_ms, self.rebalance_interval_ms,
                           self._heartbeat_and_rebalance)

    async def _heartbeat_and_rebalance(self, *, heartbeat: bool, rebalance: bool = True) -> None:
        async with self._rebalance_lock:
            routes = await self._members.known_routes()
            self._routes_seen.update(routes)
            self._levels = {TopicQueue(t, b, q): level for t, r in routes.items()
                            if r.priority_levels > 1 for b, q in r.readable_queues()
                            if (level := r.queue_level(b, q)) > 0}
            if heartbeat:
                await self._members.heartbeat(routes.values())
            if not rebalance:
                return
            if self.mode == "clustering":
                wanted = await self._members.clustering_assignment(routes)
            else:
                wanted = broadcasting_assignment(routes)
            await self._apply(wanted)

    async def _apply(self, wanted: dict[str, set[TopicQueue] | None]) -> None:
        target: set[TopicQueue] = set()
        for topic in self._subscribed:
            share = wanted.get(topic)
            if share is None:   # unknown now: keep what we hold
                target.update(tq for tq in self._fetchers if tq.topic == topic)
            else:
                target.update(share)
        lost = set(self._fetchers) - target
        if self._ordered is not None:   # and those whose lock is no longer valid
            self._ordered.drop_lapsed()
        for tq in sorted(lost):
            await self._release(tq)
        gained = sorted(target - set(self._fetchers))
        if self._ordered is not None:   # served only once locked here
            self._ordered.wanted = wanted
            gained = await self._ordered.admit(target, gained)
        if lost or gained:
            log.info("%s rebalanced: -%s +%s", self.client_id, sorted(lost), gained)
        for tq in gained:
            try:
                await self._acquire(tq)
            except FerryError as exc:
                log.warning("cannot start %s yet: %s", tq, exc)
        if self._ordered is not None:   # new queues: the keeper watches their locks
            self._ordered.poke()

    async def _release(self, tq: TopicQueue) -> None:
        fetcher = self._fetchers.pop(tq, None)
        if fetcher is None:   # ordered: dropped meanwhile (its lock lapsed)
            return
        if self._ordered is not None:   # after its record in flight; then UNLOCK
            self._ordered.release(tq, fetcher, self._forget)
            return
        await fetcher.stop()
        await self._forget(tq)

    async def _forget(self, tq: TopicQueue, commit: bool = True) -> None:
        """Commit a released queue's position (unless `commit` is False) and drop it."""
        if commit:
            await self._commit_quietly([tq])
        self._consumed.pop(tq, None)
        self._committed.pop(tq, None)

    async def _acquire(self, tq: TopicQueue) -> None:
        offset, hist, since_ms = await self._offsets.load_with_hist(tq)
        if offset is None:
            offset = await self._reset_offset(tq, since_ms)
        # The committed offset's history goes with the first PULL: a log replaced since
        # the commit sends the fetcher back (issue 16).
        fetcher = QueueFetcher(tq=tq, pool=self._pool, routes=self._routes,
                               config=self._fetch_config, wakeup=self._wakeup, fetch_offset=offset,
                               hist=hist, on_rewind=self._on_rewind)
        self._fetchers[tq] = fetcher
        self._consumed[tq] = offset
        fetcher.start()

    def _on_rewind(self, tq: TopicQueue, offset: int) -> None:
        """A fetcher went back to `offset` (the queue's history changed): the position
        committed next must not lie past it."""
        if self._consumed.get(tq, offset) > offset:
            self._consumed[tq] = offset

    async def _reset_offset(self, tq: TopicQueue, since_ms: int = 0) -> int:
        """Where `tq` starts when the group has no committed offset on it.

        A group created (namesrv's `created_ms`) before the broker's offset table
        began (`since_ms`: its store started empty) lost its offset there with the
        broker's data, or never read a broker that is newer than it: either way every
        record there was stored after the group last saw this queue, so "latest"
        starts at the queue's oldest offset (issue 16), with a WARNING, counted.
        """
        async def for_time(tq: TopicQueue, ts_ms: int) -> int:
            return (await self.offsets_for_times({tq: ts_ms}))[tq]
        if self._settings.auto_offset_reset is None:
            await self._settings.load()
        created = self._settings.created_ms
        lost = bool(created and since_ms > created)
        offset = await self._settings.start_offset(tq, self._min_max, for_time, lost=lost)
        if lost:
            self._fetch_config.history_events += 1
            log.warning("%s: group %s has no offset at the broker, whose offsets begin at %d, "
                        "after the group was created (%d): lost with the broker's data, or a "
                        "broker newer than the group; reset policy %s starts at %d",
                        tq, self.group, since_ms, created, self._settings.auto_offset_reset,
                        offset)
        return offset

    def _commit_addr(self, tq: TopicQueue) -> str | None:
        """Where `tq`'s commit goes: as its fetcher says (master, or the slave it reads from)."""
        fetcher = self._fetchers.get(tq)
        return fetcher.commit_addr() if fetcher is not None else None

    def describe(self) -> dict[str, Any]:
        """A snapshot for logs and tools: assignment and positions."""
        return {"client_id": self.client_id, "group": self.group, "mode": self.mode,
                "history_rewinds": self._fetch_config.history_events,
                "queues": {str(tq): {"position": f.delivered, "buffered": f.buffered,
                                     "reading_from": f.choice.last_addr}
                           for tq, f in sorted(self._fetchers.items())}}

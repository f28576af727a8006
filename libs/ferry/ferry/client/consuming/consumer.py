"""The asyncio Consumer: group membership, rebalance, per-queue fetchers, offsets.

`async for rec in consumer` yields records one by one; `getmany()` returns a dict
`{TopicQueue: [ConsumerRecord, ...]}` (the aiokafka shape). Positions are at-least-once:
records handed out count as consumed once the application asks for more (the next
`getmany()` / iteration step) or calls `commit()`; only consumed positions are
auto-committed, so a crash re-delivers what was being processed instead of losing it.

The consumer owns its parts: an `Assignment` (`assignment`: heartbeats and
rebalance in clustering mode, every queue in broadcasting mode, fetchers
started and stopped, an ordered consumer's queue locks) and its `Positions`
(`positions`: commits, seeks, offsets by time), to which `commit`, `seek*`,
`position`, `assignment` and `offsets_for_times` are forwarded. It keeps the per-record
path: `getmany` and `async for` take from the fetchers inline (counted per batch, metrics).

Retries (clustering): records of the group's retry topic `%RETRY%<group>` are
shown with the topic they were first consumed from (`record.topic`;
`record.stored_topic` is the retry topic) and count their redeliveries in
`reconsume_times`. `nack(record)` sends a record back (see `retry`);
`run(handler)` is the push style (see `runner`). No position is committed
past a record whose nack is not yet stored or whose `run` handler has not
finished. Broadcasting groups do not retry: `nack` logs the failure and drops
it (RocketMQ's behaviour).

Subscriptions (`subscription=`, see `subscriptions`): a tag expression, an
`Sql(...)` selector, or a dict of them per topic, filtered at the broker;
compiled at `start()`, where a bad expression raises InvalidFilterError.
`allocation=` picks the strategy of `allocation` ("average" or
"consistent_hash"). On a topic with priority levels, buffered records of a
higher level are handed out before any of a lower level of the same broker.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.consuming.allocation import allocator
from ferry.client.consuming.assignment import Assignment
from ferry.client.consuming.consume_timeout import DEFAULT_CONSUME_TIMEOUT_MS, check_consume_timeout
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.consuming.group_settings import RESETS, GroupSettings
from ferry.client.consuming.handout import Handout
from ferry.client.consuming.idempotence_hook import wire_idempotence
from ferry.client.consuming.positions import Positions, commit_addr
from ferry.client.consuming.retry import Nacker, PendingOffsets, SendBack
from ferry.client.consuming.runner import RUN_STOP_GRACE_MS, OrderedRunner, Runner
from ferry.client.consuming.subscriptions import Spec, compile_subscriptions, subscription_specs
from ferry.client.core.base import AsyncClient
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.metrics import ConsumeMetrics
from ferry.client.core.namesrv import NamesrvClient, RouteCache, TopicRoute, default_namesrv
from ferry.client.core.offsets import LocalOffsetStore, OffsetStore, RemoteOffsetStore
from ferry.client.core.tracing import traced_handler
from ferry.errors import FerryError
from ferry.names import validate_group, validate_topic
from ferry.telemetry import client_service_name, setup_tracing, tracing

log = logging.getLogger(__name__)

MODES = ("clustering", "broadcasting")


class Consumer(AsyncClient):
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
        if suspend_ms < 0 or lock_renew_interval_ms <= 0:
            raise ValueError("suspend_ms must be >= 0 and lock_renew_interval_ms > 0")
        self.topics = [validate_topic(t, allow_internal=True) for t in topics]
        self.group = validate_group(group)
        self.mode = mode
        self.allocation = allocation
        self._specs = subscription_specs(self.topics, subscription, tags)
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
        self._metrics = ConsumeMetrics(self.group)
        self._routes = RouteCache(self._namesrv, refresh_interval_ms=route_refresh_interval_ms)
        # Long polls wait up to request_timeout_ms (passed per PULL); every other request
        # (heartbeats, offsets, members) gives up sooner so a hung broker cannot stall
        # the rebalance loop for long.
        self._pool = ConnectionPool(request_timeout_ms=min(10_000, request_timeout_ms),
                                    credentials=self.credentials)
        self._fetch_config = FetchConfig(
            group=self.group, max_count=pull_batch_size, max_wait_ms=pull_max_wait_ms,
            request_timeout_ms=request_timeout_ms, prefetch_records=prefetch_records_per_queue)
        # One fetcher per served queue: the Assignment adds and removes them, getmany takes
        # from them here, the Positions read them.
        self._fetchers: dict[TopicQueue, QueueFetcher] = {}
        offsets: OffsetStore = (
            RemoteOffsetStore(self._pool, self._routes, self.group,
                              functools.partial(commit_addr, self._fetchers))
            if mode == "clustering" else LocalOffsetStore(offset_store_path))
        self._wakeup = asyncio.Event()
        self._handout = Handout()   # getmany's round-robin, `async for`'s runs
        routes_seen: dict[str, TopicRoute] = {}
        self._pending = PendingOffsets()
        self._positions = Positions(self._fetchers, self._pending, offsets, self._routes,
                                    self._pool)
        # Called on every getmany() and iteration step: bound once.
        self._promote = self._positions.promote
        self._nacker = Nacker(SendBack(self._pool, self._routes, self.group),
                              self._pending, max_reconsume_times=max_reconsume_times,
                              retry_backoff_ms=retry_backoff_ms)
        # None: the group's consume_from decides, read at start
        self._settings = GroupSettings(self._namesrv, self.group, auto_offset_reset, self._nacker)
        self._runners: set[Runner] = set()
        #: What `run(..., idempotence=...)` did: a `ferry.idempotence.IdempotenceStats` (or None).
        self.idempotence_stats: Any = None
        self.suspend_ms = suspend_ms
        self.lock_renew_interval_ms = lock_renew_interval_ms
        self._assignment = Assignment(
            client_id=self.client_id, group=self.group, mode=mode, topics=self.topics,
            allocate=allocator(allocation), pool=self._pool, routes=self._routes,
            fetchers=self._fetchers, positions=self._positions, pending=self._pending,
            settings=self._settings, fetch_config=self._fetch_config, wakeup=self._wakeup,
            routes_seen=routes_seen, heartbeat_interval_ms=heartbeat_interval_ms,
            rebalance_interval_ms=rebalance_interval_ms,
            lock_renew_interval_ms=lock_renew_interval_ms, ordered=ordered)

    @property
    def started(self) -> bool:
        return self._assignment.started

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
        await self._assignment.start()
        if self.enable_auto_commit:
            self._positions.start_auto_commit(self.auto_commit_interval_ms)

    async def stop(self, *, processed: bool = True) -> None:
        """Leave the group: stop fetching, commit, unregister, close connections.

        `processed=False` (used when `async with` exits with an exception) commits
        only positions known consumed, not the records handed out last.
        """
        if not self.started:
            return
        self._assignment.stop_serving()
        self._wakeup.set()   # a getmany() waiting in another task returns now
        for runner in list(self._runners):
            await runner.wind_down()
        await self._nacker.close(RUN_STOP_GRACE_MS)
        await self._assignment.halt()   # rebalance loop, lock keeper, fetchers
        await self._positions.close(processed=processed)   # auto-commit, the last commit
        await self._assignment.leave()
        await self._pool.close()
        await self._namesrv.close()

    async def __aexit__(self, exc_type: object = None, *exc: object) -> None:
        await self.stop(processed=exc_type is None)

    # -- reading ----------------------------------------------------------------------------
    def __aiter__(self) -> Consumer:
        return self

    async def __anext__(self) -> ConsumerRecord:
        # The current run of one queue first (handout.py), then getmany(max_records=1)
        # without its timer (stop() sets the wakeup too): both matter per message.
        run = self._handout
        if not self._assignment.levels and self.started:
            record = run.next_of_run(self._fetchers, self._positions.consumed)
            if record is not None:
                self._metrics.received_one(run.fetcher.tq, record, self._tracing)  # type: ignore[union-attr]
                return record
        self._promote()
        while True:
            for tq, records in self._take(1).items():
                run.start_run(self._fetchers.get(tq))
                return records[0]
            if not self.started:
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
        while not out and self.started:
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
        """Up to `limit` buffered records by queue, round-robin (handout.py); counted."""
        out = self._handout.take(self._fetchers.values(), self._assignment.levels, limit)
        if out:
            self._metrics.received(out, self._tracing)
        return out

    def note_received(self, tq: TopicQueue, records: list[ConsumerRecord]) -> None:
        """Counts and `receive` spans for records a runner took from a fetcher itself."""
        self._metrics.received({tq: records}, self._tracing)

    # -- positions (forwarded to the Positions part) ------------------------------------------
    async def commit(self, offsets: dict[TopicQueue, int] | None = None) -> None:
        """Commit every position handed out so far (or the given next offsets)."""
        await self._positions.commit(offsets)

    def assignment(self) -> frozenset[TopicQueue]:
        return self._positions.assignment()

    def position(self, tq: TopicQueue) -> int:
        """The next offset this consumer hands out from `tq`."""
        return self._positions.position(tq)

    async def seek(self, tq: TopicQueue, offset: int, *, keep_hist: bool = False) -> None:
        """Continue `tq` from `offset` (its buffer is dropped). `keep_hist` (internal
        rewinds): the fetcher keeps the history of the record before `offset`."""
        await self._positions.seek(tq, offset, keep_hist=keep_hist)

    async def seek_to_beginning(self, *tqs: TopicQueue) -> None:
        await self._positions.seek_to_beginning(*tqs)

    async def seek_to_end(self, *tqs: TopicQueue) -> None:
        await self._positions.seek_to_end(*tqs)

    async def offsets_for_times(self, timestamps: dict[TopicQueue, int]) -> dict[TopicQueue, int]:
        """The first offset stored at or after each timestamp (ms)."""
        return await self._positions.offsets_for_times(timestamps)

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
        if self.started:   # namesrv was away at start
            await self._settings.load_retry_policy()
        await self._nacker.nack(record, delay_ms)

    @property
    def ordered(self) -> bool:
        """True when records are handed out only from queues locked by this member."""
        return self._assignment.ordered is not None

    async def run(self, handler: Callable[..., Awaitable[Any]], *, concurrency: int = 1,
                  ordered: bool | None = None, idempotence: object = None,
                  consume_timeout_ms: int | None = DEFAULT_CONSUME_TIMEOUT_MS) -> None:
        """Push style: call `await handler(record)` for each record, up to `concurrency` at once.

        A handler that returns consumed its record; one that raises, or runs past
        `consume_timeout_ms` (None: no limit), has it nacked (`consume_timeout`).
        Offsets commit only up to the lowest record still in a handler on each
        queue. Returns once the consumer stops (`runner`: running handlers).

        Ordered (`ordered=True`; the default of an ordered consumer): one record per
        queue at a time in offset order, a failing (or timed-out) record called again
        in place after `suspend_ms`, then dead-lettered (`OrderedRunner`).

        `idempotence`: a RedisClaim, a Ledger, `ledger.transactional(...)` or any
        `wrap(handler)` check; duplicates are acknowledged, counted in `idempotence_stats`.
        """
        timeout_s = check_consume_timeout(consume_timeout_ms)
        if not self.started:
            raise RuntimeError("the consumer is not started: call start() or use `async with`")
        if idempotence is not None:   # ferry.idempotence's wiring (see idempotence_hook)
            handler, self.idempotence_stats = wire_idempotence(
                handler, idempotence, group=self.group, stats=self.idempotence_stats)
        if self._tracing.enabled:   # outermost: the idempotence check runs inside `process`
            handler = traced_handler(handler, self.group)
        queues = self._assignment.ordered
        if ordered is False and queues is not None:
            raise ValueError("this consumer is ordered: its run() is ordered too")
        if ordered and queues is None:
            queues = await self._assignment.make_ordered()
        runner: Runner
        if queues is not None:
            await self._settings.load_retry_policy()   # the dead-letter limit is the group's
            runner = OrderedRunner(self, handler, concurrency, self._pending,
                                   queues=queues, fetchers=self._fetchers,
                                   consumed=self._positions.consumed, wakeup=self._wakeup,
                                   nacker=self._nacker, suspend_ms=self.suspend_ms,
                                   consume_timeout_s=timeout_s)
        else:
            runner = Runner(self, handler, concurrency, self._pending, timeout_s)
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
        if self.started and fetcher is not None and offset < fetcher.delivered:
            await self.seek(tq, offset, keep_hist=True)

    def _subscribe(self) -> None:
        """Compile the subscriptions; they go with every PULL and HEARTBEAT."""
        self._assignment.subscribe(compile_subscriptions(self._specs))

    def describe(self) -> dict[str, Any]:
        """A snapshot for logs and tools: assignment and positions."""
        return {"client_id": self.client_id, "group": self.group, "mode": self.mode,
                "history_rewinds": self._fetch_config.history_events,
                "queues": {str(tq): {"position": f.delivered, "buffered": f.buffered,
                                     "reading_from": f.choice.last_addr}
                           for tq, f in sorted(self._fetchers.items())}}

"""A consumer's assignment: which queues it serves, and the fetchers that serve them.

`Assignment` is owned by `Consumer`. Clustering: every `heartbeat_interval_ms`
a HEARTBEAT (carrying the subscriptions, so the broker can warn about members
that differ) goes to each broker of the subscribed topics, and every
`rebalance_interval_ms` (and at start) the member list (GET_CONSUMERS) is
allocated (see `allocation`: average by default; `rebalance.periodically`
runs the loop). A lost queue is committed (through the consumer's
`Positions`) and its fetcher stopped; a gained one starts from the group's
committed offset, else from `auto_offset_reset` (when not given: the group's
`consume_from` in its namesrv config, else latest; see `group_settings`).
Broadcasting: every queue, positions kept locally (`offset_store_path` to
keep them across runs). A clustering consumer also pulls its group's retry
topic `%RETRY%<group>`, whose route appears once a broker stored a retry;
until then it is looked for again on each rebalance, quietly, and after each
nack whose copy goes to a broker the retry topic's route does not list yet
(`expect_retry`): every `RETRY_ROUTE_PROBE_MS` until the route lists that
broker (which creates the retry topic when it takes the nack, back-off or
not), then a rebalance at once. So the first retry of a new group arrives
within its back-off, not at the next periodic rebalance (issue 26).

It keeps the priority level of each queue above level 0 (`levels`, read by
the consumer's `getmany`). Ordered (`ordered=True`, or `run(handler,
ordered=True)`): queues are served only while locked at their broker,
released only at a committed position (see `ordered`, whose `OrderedHost`
this is), and `run` takes one record per queue at a time (see `runner`).

The fetchers dict is the consumer's, shared: the assignment adds and removes
fetchers, the consumer takes records from them, `Positions` reads them.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ferry.client.consuming.allocation import Allocator
from ferry.client.consuming.fetcher import FetchConfig, QueueFetcher
from ferry.client.consuming.group_settings import GroupSettings
from ferry.client.consuming.ordered import OrderedQueues
from ferry.client.consuming.positions import Positions
from ferry.client.consuming.rebalance import GroupMembership, broadcasting_assignment, periodically
from ferry.client.consuming.retry import PendingOffsets
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import RouteCache, TopicRoute
from ferry.errors import FerryError
from ferry.filter import Subscription
from ferry.names import SCHEDULE_TOPIC, retry_topic
from ferry.tasks import cancel_and_wait

log = logging.getLogger("ferry.client.consuming.consumer")

#: After a nack, how often the retry topic's route is asked for until it lists the broker
#: of the copy (see `Assignment.expect_retry`); the search ends the back-off plus a
#: rebalance interval plus RETRY_ROUTE_GRACE_MS after the nack (the periodic rebalance
#: looks on after that).
RETRY_ROUTE_PROBE_MS = 100
RETRY_ROUTE_GRACE_MS = 5_000


class Assignment:
    """The queues of one consumer: rebalance, fetchers started and stopped, ordered locks.

    It is the `OrderedHost` of its `OrderedQueues` (see `ordered`).
    """

    def __init__(self, *, client_id: str, group: str, mode: str, topics: list[str],
                 allocate: Allocator, pool: ConnectionPool, routes: RouteCache,
                 fetchers: dict[TopicQueue, QueueFetcher], positions: Positions,
                 pending: PendingOffsets, settings: GroupSettings, fetch_config: FetchConfig,
                 wakeup: asyncio.Event, routes_seen: dict[str, TopicRoute],
                 heartbeat_interval_ms: int, rebalance_interval_ms: int,
                 lock_renew_interval_ms: int, ordered: bool) -> None:
        self.client_id = client_id
        self.group = group
        self.mode = mode
        # What is pulled: the topics, and in clustering mode the group's retry topic.
        self.topics = list(topics)
        if mode == "clustering" and retry_topic(group) not in self.topics:
            self.topics.append(retry_topic(group))
        self.pool = pool
        self.routes = routes
        self.fetchers = fetchers
        self.positions = positions
        self.pending = pending
        self.settings = settings
        self.fetch_config = fetch_config
        self.wakeup = wakeup
        self.routes_seen = routes_seen   # every route read so far (send-backs go there too)
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.rebalance_interval_ms = rebalance_interval_ms
        self.lock_renew_interval_ms = lock_renew_interval_ms
        self.members = GroupMembership(pool, routes, client_id=client_id, group=group,
                                       topics=self.topics, mode=mode, allocate=allocate)
        self.levels: dict[TopicQueue, int] = {}   # priority level of queues above level 0
        self.rebalance_lock = asyncio.Lock()
        self.tasks: list[asyncio.Task[None]] = []   # the rebalance loop, the lock keeper
        self.started = False
        # Ordered consumption (see `ordered`): its queue locks, when on.
        self.ordered: OrderedQueues | None = OrderedQueues(self) if ordered else None
        self._retry_watch: asyncio.Task[None] | None = None
        if mode == "clustering":
            settings.nacker.on_stored = self.expect_retry

    def subscribe(self, subscriptions: dict[str, Subscription]) -> None:
        """The compiled subscriptions: they go with every PULL and HEARTBEAT."""
        self.fetch_config.subscribe(subscriptions)
        self.members.subscriptions = {t: s.to_fields() for t, s in subscriptions.items()}

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Join: the first heartbeat and rebalance, then the periodic ones in a task."""
        self.started = True
        # Our place in the group's join order (consistent_hash allocation): sent with
        # every heartbeat, fixed from before the first one.
        self.members.joined_ms = int(time.time() * 1000)
        await self.heartbeat_and_rebalance(heartbeat=True)
        self.tasks.append(asyncio.get_running_loop().create_task(self._coordinate(),
                                                                 name="ferry-rebalance"))

    def stop_serving(self) -> None:
        """The consumer is stopping: nothing more is handed out, admitted or locked."""
        self.started = False

    async def halt(self) -> None:
        """Stop the rebalance loop, the lock keeper and every fetcher (positions are kept)."""
        tasks, self.tasks = self.tasks, []
        for task in tasks:   # all at once: none runs another step while one is awaited
            task.cancel()
        for task in tasks:
            await cancel_and_wait(task)
        for fetcher in self.fetchers.values():
            await fetcher.stop()

    async def leave(self) -> None:
        """Drop the fetchers (halted and committed before) and unregister from the group."""
        self.fetchers.clear()
        if self.mode == "clustering":
            await self.members.unregister(self.routes_seen.values())

    async def make_ordered(self) -> OrderedQueues:
        """Ordered mode, turned on for a running consumer if it was not: its queues locked."""
        async with self.rebalance_lock:
            if self.ordered is None:
                self.ordered = OrderedQueues(self)
                await self.ordered.adopt()
        return self.ordered

    # -- the retry topic ------------------------------------------------------------------------
    def expect_retry(self, broker: str, target: str, delay_ms: int) -> None:
        """A nacked record's copy was stored, bound for `%RETRY%<group>` on `broker` after
        `delay_ms`: unless the retry topic's route lists that broker already, look for it
        (see the module docstring)."""
        retry = retry_topic(self.group)
        if not self.started or target not in (retry, SCHEDULE_TOPIC):
            return   # stopping, or a dead letter
        route = self.routes.cached(retry)
        if route is not None and any(b.name == broker for b in route.brokers):
            return
        if self._retry_watch is None or self._retry_watch.done():
            task = asyncio.get_running_loop().create_task(
                self._find_retry_route(broker, delay_ms), name="ferry-retry-route")
            self._retry_watch = task
            self.tasks.append(task)
            task.add_done_callback(self._forget_task)

    def _forget_task(self, task: asyncio.Task[None]) -> None:
        if task in self.tasks:
            self.tasks.remove(task)

    async def _find_retry_route(self, broker: str, delay_ms: int) -> None:
        retry = retry_topic(self.group)
        deadline = time.monotonic() + (delay_ms + self.rebalance_interval_ms
                                       + RETRY_ROUTE_GRACE_MS) / 1000
        while self.started and time.monotonic() < deadline:
            self.routes.invalidate(retry)
            try:
                route = await self.routes.route(retry)
            except FerryError:
                route = None
            if route is not None and any(b.name == broker for b in route.brokers):
                await self.heartbeat_and_rebalance(heartbeat=True)
                return
            await asyncio.sleep(RETRY_ROUTE_PROBE_MS / 1000)

    # -- membership and rebalance -------------------------------------------------------------
    async def _coordinate(self) -> None:
        await periodically(self.heartbeat_interval_ms, self.rebalance_interval_ms,
                           self.heartbeat_and_rebalance)

    async def heartbeat_and_rebalance(self, *, heartbeat: bool, rebalance: bool = True) -> None:
        async with self.rebalance_lock:
            routes = await self.members.known_routes()
            self.routes_seen.update(routes)
            self.levels = {TopicQueue(t, b, q): level for t, r in routes.items()
                           if r.priority_levels > 1 for b, q in r.readable_queues()
                           if (level := r.queue_level(b, q)) > 0}
            if heartbeat:
                await self.members.heartbeat(routes.values())
            if not rebalance:
                return
            if self.mode == "clustering":
                wanted = await self.members.clustering_assignment(routes)
            else:
                wanted = broadcasting_assignment(routes)
            await self.apply(wanted)

    async def apply(self, wanted: dict[str, set[TopicQueue] | None]) -> None:
        """Serve the queues of `wanted` (a topic's None: unknown now, keep what is held)."""
        target: set[TopicQueue] = set()
        for topic in self.topics:
            share = wanted.get(topic)
            if share is None:   # unknown now: keep what we hold
                target.update(tq for tq in self.fetchers if tq.topic == topic)
            else:
                target.update(share)
        lost = set(self.fetchers) - target
        if self.ordered is not None:   # and those whose lock is no longer valid
            self.ordered.drop_lapsed()
        for tq in sorted(lost):
            await self._release(tq)
        gained = sorted(target - set(self.fetchers))
        if self.ordered is not None:   # served only once locked here
            self.ordered.wanted = wanted
            gained = await self.ordered.admit(target, gained)
        if lost or gained:
            log.info("%s rebalanced: -%s +%s", self.client_id, sorted(lost), gained)
        for tq in gained:
            try:
                await self._acquire(tq)
            except FerryError as exc:
                log.warning("cannot start %s yet: %s", tq, exc)
        if self.ordered is not None:   # new queues: the keeper watches their locks
            self.ordered.poke()

    async def _release(self, tq: TopicQueue) -> None:
        fetcher = self.fetchers.pop(tq, None)
        if fetcher is None:   # ordered: dropped meanwhile (its lock lapsed)
            return
        if self.ordered is not None:   # after its record in flight; then UNLOCK
            self.ordered.release(tq, fetcher, self.forget)
            return
        await fetcher.stop()
        await self.forget(tq)

    async def forget(self, tq: TopicQueue, commit: bool = True) -> None:
        """Commit a released queue's position (unless `commit` is False) and drop it."""
        await self.positions.forget(tq, commit)

    async def _acquire(self, tq: TopicQueue) -> None:
        offset, hist, since_ms = await self.positions.offsets.load_with_hist(tq)
        if offset is None:
            offset = await self._reset_offset(tq, since_ms)
        # The committed offset's history goes with the first PULL: a log replaced since
        # the commit sends the fetcher back (issue 16).
        fetcher = QueueFetcher(tq=tq, pool=self.pool, routes=self.routes,
                               config=self.fetch_config, wakeup=self.wakeup, fetch_offset=offset,
                               hist=hist, on_rewind=self.positions.on_rewind,
                               on_reset=self.positions.on_reset)
        self.fetchers[tq] = fetcher
        self.positions.track(tq, offset)
        fetcher.start()

    async def _reset_offset(self, tq: TopicQueue, since_ms: int = 0) -> int:
        """Where `tq` starts when the group has no committed offset on it.

        A group created (namesrv's `created_ms`) before the broker's offset table
        began (`since_ms`: its store started empty) lost its offset there with the
        broker's data, or never read a broker that is newer than it: either way every
        record there was stored after the group last saw this queue, so "latest"
        starts at the queue's oldest offset (issue 16), with a WARNING, counted.
        """
        async def for_time(tq: TopicQueue, ts_ms: int) -> int:
            return (await self.positions.offsets_for_times({tq: ts_ms}))[tq]
        settings = self.settings
        if settings.auto_offset_reset is None:
            await settings.load()
        created = settings.created_ms
        lost = bool(created and since_ms > created)
        offset = await settings.start_offset(tq, self.positions.bounds, for_time, lost=lost)
        if lost:
            self.fetch_config.history_events += 1
            log.warning("%s: group %s has no offset at the broker, whose offsets begin at %d, "
                        "after the group was created (%d): lost with the broker's data, or a "
                        "broker newer than the group; reset policy %s starts at %d",
                        tq, self.group, since_ms, created, settings.auto_offset_reset, offset)
        return offset

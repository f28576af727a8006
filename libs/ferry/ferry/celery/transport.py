"""The kombu transport behind `Celery(broker="ferry://127.0.0.1:9876")`.

A kombu *virtual* transport (kombu keeps exchanges and bindings in memory and
asks the transport to put, get, ack and reject messages of named queues):

- a queue is a Ferry topic (`naming.topic_for_queue`; created with
  `topic_queues` queues per broker when missing), consumed by the group
  `celery-<topic>` (`feed.QueueFeed`);
- a message is kombu's payload as JSON, the task id as the Ferry message key,
  kombu's priority as Ferry's (`naming.ferry_priority`);
  an `eta` header (Celery's `countdown` / `eta`, retries included) becomes
  Ferry's delivery time, so the delay scheduler holds it until due;
- ack commits (see `feed`), reject requeues through the retry topic, and
  nothing is ever put back by the worker itself: unacked messages of a worker
  that stops or dies are delivered again from their uncommitted offsets;
- trace context in a task's headers (`TRACEPARENT`) makes its message a
  traced one, and a traced record's context goes back into the task's
  headers on the way out (`ferry.celery.tracing`); exchanges: `fanout`; hub: `eventloop`.

The kombu side (channel, QoS) is `ferry.celery.channel`; the admin calls
(topics, group lag) are `ferry.celery.topics`; the consumer side is
`ferry.celery.feed`. Ferry's clients are asyncio: each connection runs them on
its own loop thread (`loop.LoopThread`). Transport options
(`broker_transport_options`): `namesrv` ("h:p,h:p", overrides the URL's host),
`window`, `topic_queues`, `priority_levels`, `commit_interval_ms`,
`heartbeat_interval_ms`, `rebalance_interval_ms`, `publish_timeout_s`,
`polling_interval`, `visibility_timeout` (seconds, as for
Redis and SQS: a message taken and neither acked nor rejected within it is
retried through the group's retry topic; see `feed` and docs/celery.md).
"""
from __future__ import annotations

import atexit
import collections
import json
import logging
import threading
import time
import weakref
from queue import Empty
from typing import Any

from kombu.transport import virtual

from ferry.celery import topics
from ferry.celery.channel import Channel
from ferry.celery.eventloop import EventLoopTransport, Wakeup
from ferry.celery.feed import FeedConfig, QueueFeed, Settlement
from ferry.celery.loop import LoopThread
from ferry.celery.naming import (
    deliver_at_ms,
    ferry_priority,
    is_reply_queue,
    mark_redelivered,
    topic_for_queue,
)
from ferry.celery.tracing import headers_context, in_context, instrument, set_trace_headers
from ferry.client import Producer
from ferry.client.core.namesrv import DEFAULT_NAMESRV
from ferry.client.core.tracing import record_context
from ferry.errors import (
    AccessDeniedError,
    BusyError,
    ConnectionLostError,
    FerryError,
    InvalidDelayError,
    InvalidNameError,
    MessageTooLargeError,
    NoPermissionError,
    RequestTimeoutError,
    StoreUnavailableError,
    TopicNotFoundError,
)
from ferry.telemetry import tracing

log = logging.getLogger(__name__)

DEFAULT_PORT = int(DEFAULT_NAMESRV.rsplit(":", 1)[1])
#: How long a publish or a consumer start may take before it fails (kombu then retries).
DEFAULT_PUBLISH_TIMEOUT_S = 30.0
#: Longest sleep of drain_events between checks when nothing arrived (woken at once
#: by a new record; this only bounds how late a timeout is noticed).
DEFAULT_POLLING_INTERVAL_S = 0.5
MAX_KEY_CHARS = 128
#: The FeedConfig fields a transport option may set (ints).
FEED_OPTIONS = ("window", "topic_queues", "priority_levels", "commit_interval_ms",
                "heartbeat_interval_ms",
                "rebalance_interval_ms")
#: Every `broker_transport_options` key the transport reads (docs/celery.md lists them).
TRANSPORT_OPTIONS = ("namesrv", *FEED_OPTIONS, "publish_timeout_s", "polling_interval",
                     "visibility_timeout")


class Transport(EventLoopTransport, virtual.Transport):
    """`ferry://host:port` (namesrv): Celery's broker on Ferry topics."""

    Channel = Channel
    default_port = DEFAULT_PORT  # type: ignore[assignment]
    driver_type = "ferry"
    driver_name = "ferry"
    polling_interval = DEFAULT_POLLING_INTERVAL_S
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset(["direct", "fanout", "topic"]), heartbeats=False)
    connection_errors = virtual.Transport.connection_errors + (
        ConnectionLostError, RequestTimeoutError, BusyError, StoreUnavailableError,
        OSError)  # type: ignore[assignment]
    channel_errors = virtual.Transport.channel_errors + (
        TopicNotFoundError, InvalidNameError, MessageTooLargeError, InvalidDelayError,
        NoPermissionError, AccessDeniedError)  # type: ignore[assignment]

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        instrument()  # a worker on ferry:// traces the tasks that carry trace context
        opts = client.transport_options or {}
        self.namesrv = str(opts.get("namesrv") or
                           f"{client.hostname or '127.0.0.1'}:{client.port or DEFAULT_PORT}")
        self.timeout_s = float(opts.get("publish_timeout_s", DEFAULT_PUBLISH_TIMEOUT_S))
        feed_opts: dict[str, Any] = {k: int(opts[k]) for k in FEED_OPTIONS if k in opts}
        if "visibility_timeout" in opts:
            feed_opts["visibility_timeout_s"] = _seconds("visibility_timeout",
                                                         opts["visibility_timeout"])
        self.config = FeedConfig(namesrv=self.namesrv, **feed_opts)
        self._loop: LoopThread | None = None
        self._producer: Producer | None = None
        self._feeds: dict[str, QueueFeed] = {}          # by kombu queue name
        self._tags: dict[str, QueueFeed] = {}           # delivery tag -> its feed
        self._topics: set[str] = set()                  # known to exist
        self._auto_delete: set[str] = set()             # queues declared auto_delete here
        # Auto-delete queues declared here whose topic waits (`declare_queue`): their levels.
        self._lazy: dict[str, int | None] = {}
        self._ready = Wakeup()
        self._lock = threading.Lock()
        # Outcomes from kombu's threads, handed to the loop in batches: one wakeup of the
        # loop (a self-pipe write) per batch, not per ack (bench/celery_tasks.py).
        self._outcomes: collections.deque[tuple[QueueFeed, str, Settlement]] = collections.deque()
        self._outcomes_scheduled = False
        self._closes_at_exit = False

    # -- connection ---------------------------------------------------------------------------
    def establish_connection(self) -> Any:
        self._open()
        return super().establish_connection()

    def _open(self) -> LoopThread:
        """The loop and producer of this process (new ones after a fork)."""
        with self._lock:
            if self._loop is not None and self._loop.alive:
                return self._loop
            loop = LoopThread()
            try:
                loop.run(topics.check_namesrv(self.namesrv), self.timeout_s)
                producer = Producer(namesrv=self.namesrv, linger_ms=0)
                loop.run(producer.start(), self.timeout_s)
            except BaseException:
                loop.stop()
                raise
            self._loop, self._producer = loop, producer
            # After a fork the parent's feeds and pending outcomes belong to its loop.
            self._feeds, self._tags = {}, {}
            self._ready = Wakeup()
            self._outcomes.clear()
            self._outcomes_scheduled = False
            if not self._closes_at_exit:   # kombu pools keep connections open until exit
                atexit.register(_shutdown_at_exit, weakref.ref(self))
                self._closes_at_exit = True
            return loop

    def close_connection(self, connection: Any) -> None:
        super().close_connection(connection)
        self._shutdown()

    def _shutdown(self) -> None:
        """Stop the feeds (unsettled records stay uncommitted), the producer and the loop."""
        loop, self._loop = self._loop, None
        if loop is None or not loop.alive:
            return
        feeds, self._feeds = dict(self._feeds), {}
        for feed in feeds.values():
            _quietly(loop, feed.stop(), self.timeout_s)
        for queue in self._auto_delete.intersection(feeds):
            self._drop_topic(loop, feeds[queue])
        if self._producer is not None:
            _quietly(loop, self._producer.stop(), self.timeout_s)
        loop.stop()

    def drain_events(self, connection: Any, timeout: Any = None) -> None:  # type: ignore[override]
        """Deliver one message; wait (woken by arrivals) up to `timeout`, then socket.timeout."""
        assert self.cycle is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._ready.clear()
            if self.deliver_broadcasts():   # control before tasks (eventloop.py)
                return
            try:
                self.cycle.get(self._deliver, timeout=timeout)
                return
            except Empty:
                pass
            wait = self.polling_interval
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError()   # socket.timeout: what kombu expects
                wait = min(wait, left)
            self._ready.wait(wait)

    # -- producing ----------------------------------------------------------------------------
    def publish(self, queue: str, message: dict[str, Any]) -> None:
        """Store one kombu message in its queue's topic; returns once a broker acknowledged it."""
        loop = self._open()
        assert self._producer is not None
        headers = message.get("headers") or {}
        task_id = headers.get("id")
        key = task_id if (isinstance(task_id, str) and task_id and " " not in task_id
                          and len(task_id) <= MAX_KEY_CHARS) else None
        # A task carrying trace context (the bridge's, or the app's own) is sent traced,
        # its Ferry `send` span a child of that context (see ferry.celery.tracing).
        parent = headers_context(headers) if tracing().enabled else None
        body = json.dumps(message).encode()
        topic = topic_for_queue(queue)
        if is_reply_queue(queue):   # its caller may be gone: a topic only while it exists
            if not self.has_topic(queue):
                log.debug("ferry://: a reply to %s dropped: the queue is gone", queue)
                return   # as AMQP drops a message its exchange routes to no queue
        elif topic not in self._topics:   # whatever namesrv's auto-create setting is
            self.ensure_topic(queue, self._lazy.get(queue))
        send = self._producer.send_and_wait(
            topic, body, key=key,
            deliver_at_ms=deliver_at_ms(headers, max_delay_ms=self._producer.max_delay_ms),
            priority=ferry_priority(message.get("properties")),
            trace=True if parent is not None else None)
        loop.run(send if parent is None else in_context(parent, send), self.timeout_s)

    # -- consuming ----------------------------------------------------------------------------
    def open_feed(self, queue: str) -> QueueFeed:
        loop = self._open()
        feed = self._feeds.get(queue)
        if feed is None:
            self.ensure_topic(queue, self._lazy.get(queue))
            feed = QueueFeed(topic_for_queue(queue), self.config, self._ready)
            loop.run(feed.start(), self.timeout_s)
            self._topics.add(feed.topic)
            self._feeds[queue] = feed
        return feed

    def cancel_feed(self, queue: str) -> None:
        """kombu cancelled the last consumer of `queue` here: an auto-delete queue's feed
        stops (leaves the group) and its topic goes unless another member is left."""
        loop = self._loop
        if queue not in self._auto_delete or loop is None or not loop.alive:
            return
        feed = self._feeds.pop(queue, None)
        if feed is not None:
            _quietly(loop, feed.stop(), self.timeout_s)
            self._drop_topic(loop, feed)

    def _drop_topic(self, loop: LoopThread, feed: QueueFeed) -> None:
        self._topics.discard(feed.topic)
        _quietly(loop, topics.delete_if_unused(self.namesrv, feed.group, feed.topic),
                 self.timeout_s)

    def take(self, queue: str) -> dict[str, Any]:
        """The next message of `queue` as kombu's payload (queue.Empty if none)."""
        feed = self._feeds.get(queue) or self.open_feed(queue)
        while True:
            taken = feed.take()
            if taken is None:
                raise Empty()
            tag, record = taken
            try:
                payload = json.loads(record.body)
                props = payload["properties"]
            except (ValueError, KeyError, TypeError):
                log.error("ferry://: %s (%s offset %d) is not a kombu message; dropped",
                          record.msg_id, record.topic_queue, record.queue_offset)
                self._settle_with(feed, tag, Settlement.DROP)
                continue
            props["delivery_tag"] = tag
            if record_context(record) is not None and isinstance(payload.get("headers"), dict):
                # The task's span continues below the Ferry hops this record went through.
                set_trace_headers(payload["headers"], record.properties)
            if record.reconsume_times:   # back through the group's retry topic
                mark_redelivered(payload)
            self._tags[tag] = feed
            return payload  # type: ignore[no-any-return]

    def settle(self, tag: str, outcome: Settlement) -> None:
        feed = self._tags.pop(tag, None)
        if feed is not None:
            self._settle_with(feed, tag, outcome)

    def _settle_with(self, feed: QueueFeed, tag: str, outcome: Settlement) -> None:
        loop = self._loop
        if loop is None:
            return
        self._outcomes.append((feed, tag, outcome))
        if not self._outcomes_scheduled:
            self._outcomes_scheduled = True
            loop.call_soon(self._apply_outcomes)

    def _apply_outcomes(self) -> None:
        """On the loop: settle every outcome queued so far."""
        self._outcomes_scheduled = False   # first: an outcome queued after this schedules again
        outcomes = self._outcomes
        while outcomes:
            feed, tag, outcome = outcomes.popleft()
            feed.settle(tag, outcome)

    # -- topics -------------------------------------------------------------------------------
    def declare_queue(self, queue: str, priority_levels: int | None = None,
                      auto_delete: bool = False) -> None:
        """kombu declared `queue` here. An auto-delete queue's topic waits for its first
        publish or direct consumer: one bound to a fanout / topic exchange (a worker's
        pidbox, an event receiver's `celeryev.<uuid>`) is served from the exchange's
        topic and never gets one. A reply queue's topic is made at once: replies to a
        queue without one are dropped (`publish`)."""
        if auto_delete and not is_reply_queue(queue):
            self._lazy[queue] = priority_levels
            self._auto_delete.add(queue)
        else:
            self.ensure_topic(queue, priority_levels, auto_delete)

    def ensure_topic(self, queue: str, priority_levels: int | None = None,
                     auto_delete: bool = False) -> None:
        """Create the queue's topic unless it exists (`priority_levels`: the option's
        when None; an existing topic keeps its own). `auto_delete`: kombu's flag, the
        topic is deleted when its last consumer leaves (`cancel_feed`)."""
        if auto_delete:
            self._auto_delete.add(queue)
        topic = topic_for_queue(queue)
        if topic not in self._topics:
            levels = self.config.priority_levels if priority_levels is None else priority_levels
            self._open().run(topics.ensure_topic(self.namesrv, topic, self.config.topic_queues,
                                                 levels), self.timeout_s)
            self._topics.add(topic)

    def has_topic(self, queue: str) -> bool:
        if queue in self._lazy:
            return True   # declared here, its topic not made yet (`declare_queue`)
        return self._open().run(topics.topic_exists(self.namesrv, topic_for_queue(queue)),
                                self.timeout_s)

    def lag(self, queue: str) -> int:
        """Messages of `queue` its group has not committed yet (0 if unknown)."""
        topic = topic_for_queue(queue)
        try:
            return self._open().run(
                topics.group_lag(self.namesrv, QueueFeed.group_of(topic), topic), self.timeout_s)
        except FerryError:
            return 0

    def purge(self, queue: str) -> int:
        """Move the queue's group past what is stored (see `topics.purge`); how many."""
        topic = topic_for_queue(queue)
        return self._open().run(topics.purge(self.namesrv, QueueFeed.group_of(topic), topic),
                                self.timeout_s)

    def driver_version(self) -> str:
        from ferry import __version__
        return __version__


def _seconds(option: str, value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"transport option {option} must be a number of seconds, "
                         f"got {value!r}") from None


def _shutdown_at_exit(ref: weakref.ref[Transport]) -> None:
    transport = ref()
    if transport is not None:
        transport._shutdown()


def _quietly(loop: LoopThread, coro: Any, timeout_s: float) -> None:
    try:
        loop.run(coro, timeout_s)
    except Exception as exc:   # closing: log, never raise out of kombu's close
        log.warning("ferry://: closing: %s", exc)

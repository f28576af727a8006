"""Fanout and topic exchanges of the `ferry://` transport, on Ferry's broadcasting consumption.

kombu's remote control (the `celery.pidbox` fanout exchange: `celery inspect`,
`celery control`, `app.control.revoke`) and Celery's events (the `celeryev`
topic exchange: event receivers, Flower) need exchanges that reach every
queue bound to them in *any* process. kombu's virtual transport keeps
bindings in each process's memory, so the exchange is carried by Ferry:

- an exchange `x` of type fanout or topic is the topic `exchange_topic(x)`
  (`fanout_<x>-<hash>`, one queue per broker); a publish to it stores the
  kombu message once there, its routing key in the message
  (`properties.delivery_info.routing_key`), whatever the bindings are;
- a kombu queue bound to such an exchange is served, when a consumer starts
  on it (`basic_consume`), by a `Broadcast`: a `ferry.Consumer` of the
  exchange's topic in **broadcasting** mode (group `celery-<exchange topic>`:
  every member reads every record, positions in memory) starting at the
  latest offset, as an AMQP queue bound now gets what is published from now
  on; a topic exchange's binding patterns (`#`, `*`) are matched here, by
  kombu's own exchange type, against the record's routing key;
- replies travel as kombu's mailbox sends them: to the direct exchange
  `reply.<namespace>.pidbox` with the caller's oid as routing key, a queue
  the replying worker never bound; `direct_route` routes them to kombu's reply
  queue name `<oid>.reply.<namespace>.pidbox` (an ordinary `ferry://` queue
  whose group starts at the earliest offset, so a reply stored before the
  caller's consumer started is still read).

Broadcast messages are not acknowledged (kombu's pidbox and event consumers
use `no_ack`); a reject has nothing to requeue (broadcasting groups do not
retry). Each subscription holds at most `MAX_INBOX` records not yet taken by
kombu: past that it stops pulling until kombu catches up.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import uuid
from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport.virtual import exchange as kombu_exchange

from ferry.celery.feed import GROUP_PREFIX, FeedConfig
from ferry.celery.naming import topic_for_queue
from ferry.celery.topics import ensure_topic
from ferry.client import Consumer, ConsumerRecord
from ferry.errors import FerryError

log = logging.getLogger(__name__)

#: Exchange types carried by a Ferry topic read in broadcasting mode.
BROADCAST_TYPES = frozenset({"fanout", "topic"})
#: Queues per broker of an exchange's topic (every subscriber reads them all).
EXCHANGE_TOPIC_QUEUES = 1
#: Records one subscription holds for kombu before it pauses its pulls.
MAX_INBOX = 10_000
#: kombu's mailbox sends replies to `reply.<namespace>.pidbox` (kombu.pidbox.Mailbox).
_REPLY_PREFIX, _REPLY_SUFFIX = "reply.", ".pidbox"


def exchange_topic(exchange: str) -> str:
    """The Ferry topic of a fanout or topic exchange."""
    return topic_for_queue(f"fanout.{exchange}")


def direct_route(exchange: str, routing_key: str) -> str:
    """The queue of a direct exchange this process has no binding for.

    kombu's mailbox replies go to `<routing key>.<exchange>` (its reply queue);
    anything else follows Celery's convention: the routing key names the queue.
    """
    if exchange.startswith(_REPLY_PREFIX) and exchange.endswith(_REPLY_SUFFIX):
        return f"{routing_key}.{exchange}"
    return routing_key


class TopicExchange(kombu_exchange.TopicExchange):
    """A topic exchange published once to its Ferry topic; patterns match at each subscriber."""

    def deliver(self, message: Any, exchange: str, routing_key: str, **kwargs: Any) -> None:
        self.channel._put_fanout(exchange, message, routing_key, **kwargs)


EXCHANGE_TYPES: dict[str, Any] = {**kombu_exchange.STANDARD_EXCHANGE_TYPES,
                                  "topic": TopicExchange}


class Broadcast:
    """One exchange's records for one bound kombu queue of this process (runs on the loop)."""

    def __init__(self, exchange: str, config: FeedConfig, wake: Callable[[], None]) -> None:
        self.exchange = exchange
        self.topic = exchange_topic(exchange)
        self.config = config
        self._wake = wake
        self.inbox: collections.deque[ConsumerRecord] = collections.deque()
        self._consumer: Consumer | None = None
        self._pump: asyncio.Task[None] | None = None

    async def start(self) -> None:
        c = self.config
        await ensure_topic(c.namesrv, self.topic, EXCHANGE_TOPIC_QUEUES)
        consumer = Consumer(
            self.topic, group=GROUP_PREFIX + self.topic, namesrv=c.namesrv,
            mode="broadcasting", auto_offset_reset="latest",
            heartbeat_interval_ms=c.heartbeat_interval_ms,
            rebalance_interval_ms=c.rebalance_interval_ms, pull_max_wait_ms=c.pull_max_wait_ms,
            request_timeout_ms=c.pull_max_wait_ms + 10_000)
        await consumer.start()   # every queue's position is set (latest) when this returns
        self._consumer = consumer
        self._pump = asyncio.get_running_loop().create_task(
            self._run(consumer), name=f"ferry-celery-fanout-{self.topic}")

    async def _run(self, consumer: Consumer) -> None:
        async for record in consumer:
            self.inbox.append(record)
            self._wake()
            while len(self.inbox) >= MAX_INBOX:   # kombu is behind: pull no more meanwhile
                await asyncio.sleep(0.05)

    async def stop(self) -> None:
        """Stop pulling and leave (positions were only in memory: nothing to commit)."""
        pump, consumer, self._pump, self._consumer = self._pump, self._consumer, None, None
        if pump is not None:
            pump.cancel()
            await asyncio.gather(pump, return_exceptions=True)   # cancelled, or its error
        self.inbox.clear()
        try:
            await consumer.stop() if consumer is not None else None
        except FerryError as exc:
            log.warning("fanout of %s: stop failed: %s", self.exchange, exc)


class FanoutChannel:
    """The exchange side of the transport's kombu Channel (a mixin placed before it)."""

    supports_fanout = True
    exchange_types = EXCHANGE_TYPES
    connection: Any
    state: Any
    _tag_to_queue: dict[str, str]
    typeof: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._broadcasts: dict[str, list[Broadcast]] = {}   # by kombu queue
        super().__init__(*args, **kwargs)

    # -- publishing -----------------------------------------------------------------------------
    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str,
                    **kwargs: Any) -> None:
        transport = self.connection
        topic = exchange_topic(exchange)
        if topic not in transport._topics:   # one queue per broker, before the first send
            transport._open().run(ensure_topic(transport.namesrv, topic, EXCHANGE_TOPIC_QUEUES),
                                  transport.timeout_s)
            transport._topics.add(topic)
        transport.publish(f"fanout.{exchange}", message)

    def _queue_bind(self, exchange: str, routing_key: str, pattern: str, queue: str) -> None:
        pass   # bindings stay in this process: its subscriptions match them (see `take_from`)

    # -- consuming ------------------------------------------------------------------------------
    def broadcast_exchanges(self, queue: str) -> list[str]:
        """The fanout / topic exchanges `queue` is bound to in this process."""
        try:
            bindings = list(self.state.queue_bindings(queue))
        except KeyError:
            return []
        return sorted({b.exchange for b in bindings
                       if self.typeof(b.exchange).type in BROADCAST_TYPES})

    def open_queue(self, queue: str) -> None:
        """Start serving `queue`: from its exchanges' topics if bound to fanout / topic ones."""
        exchanges = self.broadcast_exchanges(queue)
        if not exchanges:
            self.connection.open_feed(queue)
            return
        if queue in self._broadcasts:
            return
        transport = self.connection
        loop = transport._open()
        started: list[Broadcast] = []
        for exchange in exchanges:
            sub = Broadcast(exchange, transport.config, lambda: transport._ready.set())
            loop.run(sub.start(), transport.timeout_s)
            started.append(sub)
        self._broadcasts[queue] = started

    def take_from(self, queue: str) -> dict[str, Any]:
        """The next message of `queue` for kombu (queue.Empty if none)."""
        subs = self._broadcasts.get(queue)
        if subs is None:
            return self.connection.take(queue)  # type: ignore[no-any-return]
        for sub in subs:
            while sub.inbox:
                record = sub.inbox.popleft()
                payload = self._payload(record, sub.exchange, queue)
                if payload is not None:
                    return payload
        raise Empty()

    def deliver_broadcasts(self, deliver: Callable[[dict[str, Any], str], None]) -> int:
        """Hand kombu every broadcast message ready now, before any queue's task is taken:
        a control command stored before a task (`revoke_by_stamped_headers`, then
        `apply_async`) reaches the worker first, as on Redis. How many were handed."""
        handed = 0
        for queue in list(self._broadcasts):
            while queue in self._broadcasts:   # a callback may cancel its consumer
                try:
                    payload = self.take_from(queue)
                except Empty:
                    break
                deliver(payload, queue)
                handed += 1
        return handed

    def _payload(self, record: ConsumerRecord, exchange: str, queue: str) -> dict[str, Any] | None:
        """kombu's message of `record`, if `queue`'s bindings to `exchange` select it."""
        try:
            payload = json.loads(record.body)
            props = payload["properties"]
            routing_key = props.get("delivery_info", {}).get("routing_key") or ""
        except (ValueError, KeyError, TypeError, AttributeError):
            log.error("ferry://: %s (%s offset %d) is not a kombu message; skipped",
                      record.msg_id, record.topic_queue, record.queue_offset)
            return None
        table = [row for row in self.state.exchanges.get(exchange, {}).get("table", ())
                 if row[2] == queue]
        if queue not in self.typeof(exchange).lookup(table, exchange, routing_key, None):
            return None
        props["delivery_tag"] = uuid.uuid4().hex   # each subscriber's own
        return payload  # type: ignore[no-any-return]

    def basic_cancel(self, consumer_tag: str) -> Any:
        queue = self._tag_to_queue.get(consumer_tag)
        result = super().basic_cancel(consumer_tag)  # type: ignore[misc]
        if queue is not None and queue not in self._tag_to_queue.values():
            self._stop_broadcasts(queue)
        return result

    def _stop_broadcasts(self, queue: str) -> None:
        subs = self._broadcasts.pop(queue, [])
        loop = self.connection._loop
        if loop is None or not loop.alive:   # closed already, or a forked child's copy
            return
        for sub in subs:
            try:
                loop.run(sub.stop(), self.connection.timeout_s)
            except Exception as exc:   # closing: log, never raise out of kombu's cancel
                log.warning("ferry://: stopping the fanout of %s: %s", queue, exc)

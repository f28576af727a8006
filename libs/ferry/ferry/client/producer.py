"""The asyncio Producer: routes, queue choice, batching, retries on another broker.

`send()` returns a future (awaiting `send` enqueues the message; awaiting the
future gives its SendResult), `send_and_wait()` does both. Concurrent sends to
one queue share a SEND frame (see `accumulator`). A retriable failure (the
broker died, timed out, is busy or not master) puts its broker on a skip list
for `broker_backoff_ms`, refreshes the route and sends the messages again to a
queue on another broker, up to `retries` times. Delivery is at-least-once: a
message whose ack was lost may be stored twice.
"""
from __future__ import annotations

import asyncio
import logging
import os
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ferry.client.accumulator import Batch, PendingMessage, QueueBatcher
from ferry.client.connection import DEFAULT_REQUEST_TIMEOUT_MS, ConnectionPool
from ferry.client.message import Message, SendResult, TopicQueue
from ferry.client.namesrv import DEFAULT_NAMESRV, NamesrvClient, RouteCache, TopicRoute
from ferry.errors import (
    FerryError,
    MalformedRequestError,
    MessageTooLargeError,
    SystemError_,
    TopicNotFoundError,
)
from ferry.names import validate_topic
from ferry.store.record import encode_properties, new_msg_id
from ferry.wire import MAX_BODY_BYTES, RequestCode, WireMessage, encode_messages

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = MAX_BODY_BYTES
# tags and keys have u16 length slots in the SEND batch
MAX_TAGS_KEYS_BYTES = 0xFFFF
QueueSelector = Callable[[Sequence[TopicQueue], Message], TopicQueue]


def default_namesrv() -> str:
    return os.environ.get("FERRY_NAMESRV", DEFAULT_NAMESRV)


class Producer:
    """Sends messages to topics. Use `async with Producer(namesrv=...) as p:`."""

    def __init__(self, *, namesrv: str | None = None, linger_ms: int = 5,
                 max_batch_bytes: int = 1024 * 1024, retries: int = 2,
                 request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 max_in_flight_per_queue: int = 2, broker_backoff_ms: int = 30_000,
                 route_refresh_interval_ms: int = 30_000) -> None:
        if linger_ms < 0 or max_batch_bytes <= 0 or retries < 0 or max_in_flight_per_queue < 1:
            raise ValueError("linger_ms, retries >= 0; max_batch_bytes, max_in_flight_per_queue > 0")
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.retries = retries
        self.max_in_flight_per_queue = max_in_flight_per_queue
        self.broker_backoff_ms = broker_backoff_ms
        self._namesrv = NamesrvClient(namesrv or default_namesrv())
        self._routes = RouteCache(self._namesrv, create_topics=True,
                                  refresh_interval_ms=route_refresh_interval_ms)
        self._pool = ConnectionPool(request_timeout_ms=request_timeout_ms)
        self._batchers: dict[TopicQueue, QueueBatcher] = {}
        self._round_robin: dict[str, int] = {}
        self._faulty: dict[str, float] = {}   # broker name -> monotonic time it may be used again
        self._queue_lists: dict[str, tuple[TopicRoute, list[TopicQueue]]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._started = False

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        await self._namesrv.start()
        self._started = True

    async def flush(self) -> None:
        """Wait until every message sent so far is acknowledged or failed."""
        while self._tasks or any(b.pending or b.in_flight for b in self._batchers.values()):
            await asyncio.gather(*(b.flush() for b in list(self._batchers.values())),
                                 *list(self._tasks), return_exceptions=True)

    async def stop(self) -> None:
        """Flush what was sent, then close connections."""
        if not self._started:
            return
        self._started = False
        await self.flush()
        await self._pool.close()
        await self._namesrv.close()

    async def __aenter__(self) -> Producer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # -- sending ----------------------------------------------------------------------------
    async def send(self, topic: str, body: bytes, key: str | None = None,
                   tags: str | None = None, properties: Mapping[str, str] | None = None,
                   ordered: bool = False, queue_selector: QueueSelector | None = None,
                   keys: Sequence[str] = ()) -> asyncio.Future[SendResult]:
        """Queue one message; the returned future resolves to its SendResult."""
        msg = Message(body=body, key=key, keys=tuple(keys), tags=tags, properties=properties or {})
        return (await self._enqueue(topic, [msg], ordered, queue_selector))[0]

    async def send_and_wait(self, topic: str, body: bytes, key: str | None = None,
                            tags: str | None = None, properties: Mapping[str, str] | None = None,
                            ordered: bool = False, queue_selector: QueueSelector | None = None,
                            keys: Sequence[str] = ()) -> SendResult:
        fut = await self.send(topic, body, key, tags, properties, ordered, queue_selector, keys)
        return await fut

    async def send_batch(self, topic: str, messages: Sequence[Message], *,
                         ordered: bool = False,
                         queue_selector: QueueSelector | None = None) -> list[SendResult]:
        """Send several messages to ONE queue (chosen by the first message) in one frame."""
        if not messages:
            return []
        futs = await self._enqueue(topic, list(messages), ordered, queue_selector, together=True)
        return list(await asyncio.gather(*futs))

    def send_oneway(self, topic: str, body: bytes, key: str | None = None,
                    tags: str | None = None, properties: Mapping[str, str] | None = None) -> None:
        """Send without waiting for or receiving any acknowledgement (may be lost)."""
        self._check_started()
        msg = Message(body=body, key=key, tags=tags, properties=properties or {})
        wire = _to_wire(msg)
        task = asyncio.get_running_loop().create_task(self._oneway(topic, wire))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _oneway(self, topic: str, wire: WireMessage) -> None:
        try:
            route = await self._routes.route(topic)
            tq = self._pick_round_robin(topic, route)
            addr = route.broker_addr(tq.broker)
            if addr is None:
                raise TopicNotFoundError(f"broker {tq.broker} of {topic} has no master")
            conn = await self._pool.get(addr)
            conn.send_oneway(RequestCode.SEND, {"topic": topic, "queue_id": tq.queue_id},
                             encode_messages([wire]))
        except FerryError as exc:
            log.warning("one-way send to %s dropped: %s", topic, exc)

    # -- queue choice -----------------------------------------------------------------------
    def _check_started(self) -> None:
        if not self._started:
            raise RuntimeError("the producer is not started: call start() or use `async with`")

    async def _enqueue(self, topic: str, msgs: list[Message], ordered: bool,
                       selector: QueueSelector | None,
                       together: bool = False) -> list[asyncio.Future[SendResult]]:
        self._check_started()
        validate_topic(topic)
        loop = asyncio.get_running_loop()
        items = []
        for msg in msgs:
            if not isinstance(msg.body, bytes | bytearray | memoryview):
                raise TypeError(f"message body must be bytes, not {type(msg.body).__name__}")
            if len(msg.body) > MAX_MESSAGE_BYTES:
                raise MessageTooLargeError(
                    f"message body is {len(msg.body)} bytes; the limit is {MAX_MESSAGE_BYTES}")
            items.append(PendingMessage(wire=_to_wire(msg), future=loop.create_future(),
                                        topic=topic, key=msg.key, ordered=ordered))
        route = await self._routes.route(topic)
        if together:
            tq = self._choose(topic, route, msgs[0], ordered, selector)
            for item in items:
                self._batcher(tq).add(item)
        else:
            for msg, item in zip(msgs, items, strict=True):
                self._batcher(self._choose(topic, route, msg, ordered, selector)).add(item)
        return [item.future for item in items]  # type: ignore[misc]

    def _usable_queues(self, topic: str, route: TopicRoute) -> list[TopicQueue]:
        cached = self._queue_lists.get(topic)
        if cached is None or cached[0] is not route:
            queues = [TopicQueue(topic, b, q) for b, q in route.writable_queues()]
            self._queue_lists[topic] = cached = (route, queues)
        queues = cached[1]
        if not queues:
            raise TopicNotFoundError(f"topic {topic} has no writable queue on a live broker")
        if not self._faulty:
            return queues
        now = time.monotonic()
        for name in [n for n, until in self._faulty.items() if until <= now]:
            del self._faulty[name]
        healthy = [tq for tq in queues if tq.broker not in self._faulty]
        return healthy or queues  # every broker looks faulty: try them anyway

    def _pick_round_robin(self, topic: str, route: TopicRoute) -> TopicQueue:
        queues = self._usable_queues(topic, route)
        n = self._round_robin.get(topic, 0)
        self._round_robin[topic] = n + 1
        return queues[n % len(queues)]

    def _choose(self, topic: str, route: TopicRoute, msg: Message, ordered: bool,
                selector: QueueSelector | None) -> TopicQueue:
        if selector is not None:
            return selector(self._usable_queues(topic, route), msg)
        if ordered and msg.key:
            queues = self._usable_queues(topic, route)
            return queues[zlib.crc32(msg.key.encode()) % len(queues)]
        return self._pick_round_robin(topic, route)

    def _batcher(self, tq: TopicQueue) -> QueueBatcher:
        batcher = self._batchers.get(tq)
        if batcher is None:
            async def send(batch: Batch, tq: TopicQueue = tq) -> None:
                await self._send_batch(tq, batch)
            batcher = QueueBatcher(send, linger_ms=self.linger_ms,
                                   max_batch_bytes=self.max_batch_bytes,
                                   max_in_flight=self.max_in_flight_per_queue)
            self._batchers[tq] = batcher
        return batcher

    # -- the SEND request and its retries ---------------------------------------------------
    async def _send_batch(self, tq: TopicQueue, batch: Batch) -> None:
        items = [it for it in batch.items if not it.future.done()]
        if not items:
            return
        try:
            route = self._routes.cached(tq.topic) or await self._routes.route(tq.topic)
            addr = route.broker_addr(tq.broker)
            if addr is None:
                raise TopicNotFoundError(f"broker {tq.broker} no longer serves {tq.topic}")
            resp = await self._pool.request(
                addr, RequestCode.SEND, {"topic": tq.topic, "queue_id": tq.queue_id},
                encode_messages([it.wire for it in items]))
        except FerryError as exc:
            self._on_failure(tq, items, exc)
            return
        except Exception as exc:  # a bug must not leave futures pending forever
            log.exception("send to %s failed unexpectedly", tq)
            self._on_failure(tq, items, SystemError_(f"unexpected client error: {exc!r}"))
            return
        first = int(resp.fields.get("queue_offset", -1))
        queue_id = int(resp.fields.get("queue_id", tq.queue_id))
        for i, it in enumerate(items):
            if not it.future.done():
                it.future.set_result(SendResult(
                    msg_id=it.wire.msg_id.hex().upper(), topic=tq.topic, queue_id=queue_id,
                    queue_offset=first + i if first >= 0 else -1, broker=tq.broker))

    def _on_failure(self, tq: TopicQueue, items: list[PendingMessage], exc: FerryError) -> None:
        if not exc.retriable:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        log.info("send to %s failed (%s); retrying elsewhere", tq, exc)
        self._faulty[tq.broker] = time.monotonic() + self.broker_backoff_ms / 1000
        self._routes.invalidate(tq.topic)
        retry = []
        for it in items:
            it.attempts += 1
            if it.attempts > self.retries:
                if not it.future.done():
                    it.future.set_exception(exc)
            else:
                retry.append(it)
        if retry:
            task = asyncio.get_running_loop().create_task(self._resubmit(tq.topic, retry))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _resubmit(self, topic: str, items: list[PendingMessage]) -> None:
        try:
            route = await self._routes.route(topic)
        except FerryError as exc:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        for it in items:
            msg = Message(body=it.wire.body, key=it.key)
            tq = self._choose(topic, route, msg, it.ordered, None)
            self._batcher(tq).add(it)


def _to_wire(msg: Message) -> WireMessage:
    """The wire form of a message; bad fields raise here, before they could fail a batch."""
    props = encode_properties(dict(msg.properties)) if msg.properties else b""
    tags, keys = msg.tags or "", msg.all_keys()
    if len(tags.encode()) > MAX_TAGS_KEYS_BYTES or len(keys.encode()) > MAX_TAGS_KEYS_BYTES:
        raise MalformedRequestError(f"tags and keys are limited to {MAX_TAGS_KEYS_BYTES} bytes")
    return WireMessage(body=bytes(msg.body), msg_id=new_msg_id(),
                       born_ts_ms=int(time.time() * 1000), tags=tags, keys=keys,
                       properties=props)

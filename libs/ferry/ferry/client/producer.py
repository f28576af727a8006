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

from ferry.client.accumulator import (
    MAX_BATCH_MESSAGES,
    Batch,
    Pending,
    PendingGroup,
    PendingMessage,
    QueueBatcher,
)
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
from ferry.wire import MAX_BODY_BYTES, MESSAGE_HEAD, RequestCode, WireMessage, encode_messages

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = MAX_BODY_BYTES
# tags and keys have u16 length slots in the SEND batch
MAX_TAGS_KEYS_BYTES = 0xFFFF
QueueSelector = Callable[[Sequence[TopicQueue], Message], TopicQueue]
_HEAD_SIZE = MESSAGE_HEAD.size
_pack_head = MESSAGE_HEAD.pack
_MAX_VALID_TOPICS = 4096   # names already validated, so a hot send does not check again


def default_namesrv() -> str:
    return os.environ.get("FERRY_NAMESRV", DEFAULT_NAMESRV)


class Producer:
    """Sends messages to topics. Use `async with Producer(namesrv=...) as p:`."""

    def __init__(self, *, namesrv: str | None = None, linger_ms: int = 1,
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
        self._valid_topics: set[str] = set()
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
        self._check_topic(topic)
        _check_body(body)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        if key is None and not keys and not tags and not properties:
            # The common plain message: packed here, without the general encoder.
            body = body if type(body) is bytes else bytes(body)
            msg_id = new_msg_id()
            born_ts_ms = int(time.time() * 1000)
            size = len(body)
            item = PendingMessage(
                WireMessage(body, msg_id, born_ts_ms), fut, topic,
                encoded=_pack_head(_HEAD_SIZE + size, msg_id, born_ts_ms, 0, 0, 0, 0, size) + body)
        else:
            wire = _make_wire(body, key, tuple(keys), tags, properties)
            item = PendingMessage(wire=wire, future=fut, topic=topic, key=key, ordered=ordered)
        route = await self._routes.route(topic)
        if queue_selector is not None:
            msg = Message(body=body, key=key, keys=tuple(keys), tags=tags,
                          properties=properties or {})
            tq = self._choose(topic, route, msg, ordered, queue_selector)
        else:
            tq = self._choose_by_key(topic, route, key, ordered)
        self._batcher(tq).add(item)
        return fut

    async def send_and_wait(self, topic: str, body: bytes, key: str | None = None,
                            tags: str | None = None, properties: Mapping[str, str] | None = None,
                            ordered: bool = False, queue_selector: QueueSelector | None = None,
                            keys: Sequence[str] = ()) -> SendResult:
        fut = await self.send(topic, body, key, tags, properties, ordered, queue_selector, keys)
        return await fut

    async def send_batch(self, topic: str, messages: Sequence[Message], *,
                         ordered: bool = False,
                         queue_selector: QueueSelector | None = None) -> list[SendResult]:
        """Send several messages to ONE queue (chosen by the first message) in one frame.

        The messages are encoded once, here, and wait as one entry with one
        future. A batch over `max_batch_bytes` is split over several frames
        of the same queue.
        """
        if not messages:
            return []
        self._check_topic(topic)
        msg_ids, encoded = _encode_group(messages)
        if len(encoded) > self.max_batch_bytes or len(msg_ids) > MAX_BATCH_MESSAGES:
            futs = await self._enqueue(topic, list(messages), ordered, queue_selector,
                                       together=True)
            return list(await asyncio.gather(*futs))
        first = messages[0]
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        group = PendingGroup(msg_ids=msg_ids, encoded=encoded, future=fut, topic=topic,
                             first_body=bytes(first.body), key=first.key, ordered=ordered)
        route = await self._routes.route(topic)
        self._batcher(self._choose(topic, route, first, ordered, queue_selector)).add(group)
        results: list[SendResult] = await fut
        return results

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

    def _check_topic(self, topic: str) -> None:
        """Started, and a valid topic name (each name is validated once)."""
        self._check_started()
        if topic not in self._valid_topics:
            validate_topic(topic)
            if len(self._valid_topics) >= _MAX_VALID_TOPICS:
                self._valid_topics.clear()
            self._valid_topics.add(topic)

    async def _enqueue(self, topic: str, msgs: list[Message], ordered: bool,
                       selector: QueueSelector | None,
                       together: bool = False) -> list[asyncio.Future[SendResult]]:
        self._check_topic(topic)
        loop = asyncio.get_running_loop()
        items = []
        for msg in msgs:
            _check_body(msg.body)
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
        return self._choose_by_key(topic, route, msg.key, ordered)

    def _choose_by_key(self, topic: str, route: TopicRoute, key: str | None,
                       ordered: bool) -> TopicQueue:
        if ordered and key:
            queues = self._usable_queues(topic, route)
            return queues[zlib.crc32(key.encode()) % len(queues)]
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
            body = items[0].encoded if len(items) == 1 else b"".join([it.encoded for it in items])
            resp = await self._pool.request(
                addr, RequestCode.SEND, {"topic": tq.topic, "queue_id": tq.queue_id}, body)
        except FerryError as exc:
            self._on_failure(tq, items, exc)
            return
        except Exception as exc:  # a bug must not leave futures pending forever
            log.exception("send to %s failed unexpectedly", tq)
            self._on_failure(tq, items, SystemError_(f"unexpected client error: {exc!r}"))
            return
        first = int(resp.fields.get("queue_offset", -1))
        queue_id = int(resp.fields.get("queue_id", tq.queue_id))
        offset = first
        for it in items:
            if not it.future.done():
                if isinstance(it, PendingGroup):
                    it.future.set_result(_group_results(it, tq, queue_id, offset))
                else:
                    it.future.set_result(SendResult(
                        msg_id=it.wire.msg_id.hex().upper(), topic=tq.topic, queue_id=queue_id,
                        queue_offset=offset, broker=tq.broker))
            if first >= 0:
                offset += it.count

    def _on_failure(self, tq: TopicQueue, items: list[Pending], exc: FerryError) -> None:
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

    async def _resubmit(self, topic: str, items: list[Pending]) -> None:
        try:
            route = await self._routes.route(topic)
        except FerryError as exc:
            for it in items:
                if not it.future.done():
                    it.future.set_exception(exc)
            return
        for it in items:
            tq = self._choose_by_key(topic, route, it.key, it.ordered)
            self._batcher(tq).add(it)


def _check_body(body: object) -> None:
    if not isinstance(body, bytes | bytearray | memoryview):
        raise TypeError(f"message body must be bytes, not {type(body).__name__}")
    if len(body) > MAX_MESSAGE_BYTES:
        raise MessageTooLargeError(
            f"message body is {len(body)} bytes; the limit is {MAX_MESSAGE_BYTES}")


def _to_wire(msg: Message) -> WireMessage:
    """The wire form of a message; bad fields raise here, before they could fail a batch."""
    return _make_wire(msg.body, msg.key, msg.keys, msg.tags, msg.properties)


def _make_wire(body: bytes, key: str | None, keys: tuple[str, ...], tags: str | None,
               properties: Mapping[str, str] | None, msg_id: bytes = b"",
               born_ts_ms: int = 0) -> WireMessage:
    props = encode_properties(dict(properties)) if properties else b""
    tags = tags or ""
    all_keys = Message(b"", key, keys).all_keys() if key or keys else ""
    if len(tags.encode()) > MAX_TAGS_KEYS_BYTES or len(all_keys.encode()) > MAX_TAGS_KEYS_BYTES:
        raise MalformedRequestError(f"tags and keys are limited to {MAX_TAGS_KEYS_BYTES} bytes")
    return WireMessage(body=bytes(body), msg_id=msg_id or new_msg_id(),
                       born_ts_ms=born_ts_ms or int(time.time() * 1000), tags=tags,
                       keys=all_keys, properties=props)


def _encode_group(msgs: Sequence[Message]) -> tuple[list[bytes], bytes]:
    """The ids and the SEND-batch bytes of `msgs`, encoded in one pass.

    A message with no key, tags or properties (the common case) is packed here
    directly; others go through the full encoder. Bad input raises before
    anything is queued.
    """
    born_ts_ms = int(time.time() * 1000)
    msg_ids: list[bytes] = []
    parts: list[bytes] = []
    for msg in msgs:
        body = msg.body
        if type(body) is not bytes:
            _check_body(body)
            body = bytes(body)
        size = len(body)
        if size > MAX_MESSAGE_BYTES:
            _check_body(body)
        msg_id = new_msg_id()
        msg_ids.append(msg_id)
        if msg.key or msg.keys or msg.tags or msg.properties:
            parts.append(encode_messages([_make_wire(body, msg.key, msg.keys, msg.tags,
                                                     msg.properties, msg_id, born_ts_ms)]))
        else:
            parts.append(_pack_head(_HEAD_SIZE + size, msg_id, born_ts_ms, 0, 0, 0, 0, size))
            parts.append(body)
    return msg_ids, b"".join(parts)


def _group_results(group: PendingGroup, tq: TopicQueue, queue_id: int,
                   first: int) -> list[SendResult]:
    """The SendResults of a group stored from queue offset `first` (-1: unknown)."""
    ids = b"".join(group.msg_ids).hex().upper()
    topic, broker = tq.topic, tq.broker
    if first < 0:
        return [SendResult(ids[32 * i:32 * i + 32], topic, queue_id, -1, broker)
                for i in range(len(group.msg_ids))]
    return [SendResult(ids[32 * i:32 * i + 32], topic, queue_id, first + i, broker)
            for i in range(len(group.msg_ids))]

"""The asyncio Producer: routes, queue choice, batching, retries, a bounded buffer.

`send()` returns a future (awaiting `send` enqueues the message; awaiting the
future gives its SendResult), `send_and_wait()` does both. Concurrent sends to
one queue share a SEND frame (see `accumulator`). Queued but unacknowledged
bytes are bounded by `buffer_memory_bytes`: `send()` waits for room up to
`max_block_ms` (see `buffer`).

The producer owns its parts: a `Sender` (`sender`: one accumulator per
queue, the SEND requests, retries on another broker or, for an ordered
message, on its own queue, and failover through the route), the `Lanes` of
plain messages (`lanes`: `send`'s fast path) and a `Sampler` (`tracing`).
`send` checks its input, decides tracing, and either hands a plain message
to a lane's accumulator inline or builds an entry (`pending`) and `place`s
it through the sender.

Delay and time to live (`delay_ms`, `deliver_at_ms`, `ttl_ms`) travel as
system properties with a message flag (`timing` in `encoding`); a SEND frame
announces the OR of its entries' flags so that the broker's before-put hooks
see them, and a plain message takes the same path, at the same cost, as
before. `cancel_delayed` asks the delay scheduler (see `delay`).
"""
from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.base import AsyncClient
from ferry.client.core.connection import DEFAULT_REQUEST_TIMEOUT_MS, ConnectionPool
from ferry.client.core.message import Message, SendResult
from ferry.client.core.namesrv import NamesrvClient, RouteCache, default_namesrv
from ferry.client.core.tracing import (
    TRACED,
    Sampler,
    batch_trace,
    carry,
    end_on_result,
    start_send,
)
from ferry.client.producing.accumulator import let_batches_go
from ferry.client.producing.buffer import ByteBudget
from ferry.client.producing.delay import DelaySchedulerClient
from ferry.client.producing.encoding import (
    DEFAULT_MAX_DELAY_MS,
    HEAD_SIZE,
    MAX_MESSAGE_BYTES,
    check_body,
    make_wire,
    timing,
    to_wire,
)
from ferry.client.producing.lanes import Lanes
from ferry.client.producing.pending import PendingMessage
from ferry.client.producing.queues import QueueChooser, QueueSelector, check_priority, pinned
from ferry.client.producing.sender import Sender
from ferry.names import validate_topic
from ferry.telemetry import Tracing, client_service_name, setup_tracing, tracing
from ferry.wire import WireMessage, encode_messages

__all__ = ["MAX_MESSAGE_BYTES", "Producer", "QueueSelector"]

_MAX_VALID_TOPICS = 4096   # names already validated, so a hot send does not check again
_get_running_loop = asyncio.get_running_loop


class Producer(AsyncClient):
    """Sends messages to topics. Use `async with Producer(namesrv=...) as p:`."""

    def __init__(self, *, namesrv: str | None = None, linger_ms: int = 1,
                 max_batch_bytes: int = 1024 * 1024, retries: int = 2,
                 request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 max_in_flight_per_queue: int = 2, broker_backoff_ms: int = 30_000,
                 route_refresh_interval_ms: int = 30_000,
                 buffer_memory_bytes: int = 32 * 1024 * 1024, max_block_ms: int = 60_000,
                 retry_backoff_ms: int = 100, max_delay_ms: int = DEFAULT_MAX_DELAY_MS,
                 delay_scheduler: str | None = None,
                 credentials: Credentials | None = None) -> None:
        """`credentials` sign every request (default: FERRY_ACCESS_KEY/FERRY_SECRET_KEY,
        unsigned when those are unset)."""
        if linger_ms < 0 or max_batch_bytes <= 0 or retries < 0 or max_in_flight_per_queue < 1:
            raise ValueError("linger_ms, retries >= 0; max_batch_bytes, max_in_flight_per_queue > 0")
        if buffer_memory_bytes <= 0 or max_block_ms < 0 or retry_backoff_ms < 0:
            raise ValueError("buffer_memory_bytes > 0; max_block_ms, retry_backoff_ms >= 0")
        if max_delay_ms < 1:
            raise ValueError("max_delay_ms must be at least 1")
        self.max_delay_ms = max_delay_ms
        self.credentials = credentials if credentials is not None else Credentials.from_env()
        self._scheduler = DelaySchedulerClient(delay_scheduler, credentials=self.credentials)
        self.linger_ms = linger_ms
        self.max_batch_bytes = max_batch_bytes
        self.retries = retries
        self.max_in_flight_per_queue = max_in_flight_per_queue
        self.broker_backoff_ms = broker_backoff_ms
        self.max_block_ms = max_block_ms
        self.retry_backoff_ms = retry_backoff_ms
        self._namesrv_addr = namesrv or default_namesrv()
        self._namesrv = NamesrvClient(self._namesrv_addr, credentials=self.credentials)
        self._routes = RouteCache(self._namesrv, create_topics=True,
                                  refresh_interval_ms=route_refresh_interval_ms)
        self._pool = ConnectionPool(request_timeout_ms=request_timeout_ms,
                                    credentials=self.credentials)
        self._budget = ByteBudget(buffer_memory_bytes)
        self._chooser = QueueChooser(broker_backoff_ms)
        self._sender = Sender(self._routes, self._pool, self._budget, self._chooser,
                              linger_ms=linger_ms, max_batch_bytes=max_batch_bytes,
                              max_in_flight_per_queue=max_in_flight_per_queue, retries=retries,
                              retry_backoff_ms=retry_backoff_ms, max_block_ms=max_block_ms,
                              max_delay_ms=max_delay_ms)
        self._lanes = Lanes(self._routes, self._chooser, self._sender.batcher)
        # makes send()'s futures in the producer's loop (see _bind_loop)
        self._new_future: Callable[[], asyncio.Future[Any]] = self._first_future
        self._valid_topics: set[str] = set()
        self._started = False
        self._sampler = Sampler(tracing())

    # -- lifecycle --------------------------------------------------------------------------
    async def start(self) -> None:
        self._bind_loop(_get_running_loop())
        self._tracing = setup_tracing(client_service_name(), namesrv=self._namesrv_addr)
        await self._namesrv.start()
        self._started = True

    async def flush(self) -> None:
        """Wait until every message sent so far is acknowledged or failed."""
        await self._sender.flush()

    async def stop(self) -> None:
        """Flush what was sent, then close connections."""
        if not self._started:
            return
        self._started = False
        await self.flush()
        self._lanes.close()
        await self._pool.close()
        await self._namesrv.close()
        await self._scheduler.close()


    @property
    def buffered_bytes(self) -> int:
        """Bytes queued but not yet acknowledged or failed (bounded by buffer_memory_bytes)."""
        return self._budget.used_bytes

    # -- sending ----------------------------------------------------------------------------
    async def send(self, topic: str, body: bytes, key: str | None = None,
                   tags: str | None = None, properties: Mapping[str, str] | None = None,
                   ordered: bool = False, queue_selector: QueueSelector | None = None,
                   keys: Sequence[str] = (), *, delay_ms: int | None = None,
                   deliver_at_ms: int | None = None, ttl_ms: int | None = None,
                   priority: int = 0, trace: bool | None = None) -> asyncio.Future[SendResult]:
        """Queue one message; the returned future resolves to its SendResult.

        `delay_ms` (from now) or `deliver_at_ms` (epoch ms) hold the message
        back until then (InvalidDelayError beyond `max_delay_ms`; 0, or a time
        not in the future, means now); its SendResult then has queue_offset -1.
        `ttl_ms` > 0: never delivered once that long has passed since it was
        stored in its topic. `priority` 0..3 (3 highest; ValueError otherwise):
        on a topic with priority levels the message goes to a queue of level
        `priority * levels // 4`, which consumers drain before lower levels (a
        key keeps its order within one level). Waits while the buffer is full
        (up to `max_block_ms`, then BusyError). `trace`: True traces this
        message, False never, None (default) samples at FERRY_TRACE_SAMPLE_RATIO
        (docs/tracing.md); no effect with FERRY_TRACING=off.
        """
        # The checks of _check_topic and check_body, inline: they run for every message.
        if not self._started or topic not in self._valid_topics:
            self._check_topic(topic)
        if type(body) is not bytes or len(body) > MAX_MESSAGE_BYTES:
            check_body(body)
        if trace is None:   # sampled: a countdown, drawn once per traced message
            sampler = self._sampler
            left = sampler.left
            if left > 0:
                sampler.left = left - 1
                traced = False
            else:
                traced = sampler.next()
        else:
            traced = bool(trace) and self._sampler.tracing.enabled
        if (traced or key is not None or keys or tags or properties or priority
                or queue_selector is not None or delay_ms is not None
                or deliver_at_ms is not None or ttl_ms is not None):
            return await self._send_one(topic, body, key, tags, properties, ordered,
                                        queue_selector, keys, delay_ms, deliver_at_ms, ttl_ms,
                                        priority, traced)
        # A plain message, the common case: no object of its own (see accumulator).
        if type(body) is not bytes:
            body = bytes(body)
        nbytes = HEAD_SIZE + len(body)
        lanes = self._lanes
        lane = lanes.by_topic.get(topic)
        budget = self._budget
        if (lane is None or lanes.route_entries.get(topic) is not lane[0]
                or not self._chooser.all_healthy
                or budget.used_bytes + nbytes > budget.limit_bytes or budget.waiters):
            return await self._send_plain(topic, body, nbytes)
        budget.used_bytes += nbytes
        fut: asyncio.Future[Any] = self._new_future()
        if next(lane[1]).add_plain(body, fut, nbytes):
            await let_batches_go()   # a burst: its batches go out meanwhile (accumulator)
        return fut

    async def _send_plain(self, topic: str, body: bytes,
                          nbytes: int) -> asyncio.Future[SendResult]:
        """`send`'s plain message off its fast path: the route is fetched, the buffer
        waited for, a broker that failed recently skipped, the topic's lane (re)built."""
        route = await self._routes.route(topic)
        budget = self._budget
        if budget.used_bytes + nbytes > budget.limit_bytes or budget.waiters:
            await budget.take(nbytes, self.max_block_ms)   # BusyError after max_block_ms
            try:
                route = await self._routes.route(topic)   # it may have changed meanwhile
            except BaseException:
                budget.release(nbytes)
                raise
        else:
            budget.used_bytes += nbytes
        try:
            batcher = self._lanes.next_batcher(topic, route)
        except BaseException:
            budget.release(nbytes)
            raise
        fut: asyncio.Future[Any] = self._new_future()
        if batcher.add_plain(body, fut, nbytes):
            await let_batches_go()
        return fut

    async def _send_one(self, topic: str, body: bytes, key: str | None, tags: str | None,
                        properties: Mapping[str, str] | None, ordered: bool,
                        queue_selector: QueueSelector | None, keys: Sequence[str],
                        delay_ms: int | None, deliver_at_ms: int | None, ttl_ms: int | None,
                        priority: int, traced: bool) -> asyncio.Future[SendResult]:
        """`send` of a message with options: its own PendingMessage, encoded in full."""
        if priority:
            check_priority(priority)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        span = start_send(topic, len(body)) if traced else None
        flags = 0
        if span is not None:   # a traced message: its context travels in its properties
            end_on_result(span, fut)   # ends with the broker's answer (or the send's failure)
            properties = carry(span, properties)
            flags = TRACED
        try:
            if delay_ms is not None or deliver_at_ms is not None or ttl_ms is not None:
                born_ts_ms = int(time.time() * 1000)
                extra, timing_flags = timing(delay_ms, deliver_at_ms, ttl_ms,
                                             self.max_delay_ms, born_ts_ms)
                flags |= timing_flags
                properties = {**properties, **extra} if properties else extra
                wire = make_wire(body, key, tuple(keys), tags, properties,
                                 born_ts_ms=born_ts_ms, flags=flags)
            else:
                wire = make_wire(body, key, tuple(keys), tags, properties, flags=flags)
        except BaseException:
            fut.cancel()   # bad input: a traced message's span ends, never sent
            raise
        item = PendingMessage(wire=wire, future=fut, topic=topic, key=key, priority=priority,
                              ordered=pinned(ordered, key, queue_selector))
        chooser = self._chooser
        try:
            route = await self._routes.route(topic)
            if queue_selector is not None:
                msg = Message(body=body, key=key, keys=tuple(keys), tags=tags,
                              properties=properties or {}, priority=priority)
                await self._sender.place(item, lambda: chooser.choose(
                    topic, route, msg, ordered, queue_selector))
            else:
                await self._sender.place(item, lambda: chooser.by_key(
                    topic, route, key, ordered, priority))
        except BaseException:
            fut.cancel()   # never sent (BusyError after max_block_ms...): a traced span ends
            raise
        return fut

    async def send_and_wait(self, topic: str, body: bytes, key: str | None = None,
                            tags: str | None = None, properties: Mapping[str, str] | None = None,
                            ordered: bool = False, queue_selector: QueueSelector | None = None,
                            keys: Sequence[str] = (), *, delay_ms: int | None = None,
                            deliver_at_ms: int | None = None, ttl_ms: int | None = None,
                            priority: int = 0, trace: bool | None = None) -> SendResult:
        fut = await self.send(topic, body, key, tags, properties, ordered, queue_selector, keys,
                              delay_ms=delay_ms, deliver_at_ms=deliver_at_ms, ttl_ms=ttl_ms,
                              priority=priority, trace=trace)
        return await fut

    async def _send_wire(self, topic: str, wire: WireMessage,
                         key: str | None = None) -> asyncio.Future[SendResult]:
        """Queue one already-encoded (possibly flagged) message, like a plain `send`.

        For the TransactionProducer's half messages: the queue is chosen and the
        batch shared exactly as for any send, and the SEND frame announces the
        message's flags. The plain `send` path does not go through here.
        """
        self._check_topic(topic)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        item = PendingMessage(wire=wire, future=fut, topic=topic, key=key)
        route = await self._routes.route(topic)
        await self._sender.place(item, lambda: self._chooser.by_key(topic, route, key, False))
        return fut

    async def send_batch(self, topic: str, messages: Sequence[Message], *,
                         ordered: bool = False,
                         queue_selector: QueueSelector | None = None) -> list[SendResult]:
        """Send several messages to ONE queue (chosen by the first message) in one frame.

        The messages are encoded once, here, and wait as one entry with one
        future. A batch over `max_batch_bytes` is split over several frames
        of the same queue (of the first message's priority level).
        """
        if not messages:
            return []
        self._check_topic(topic)
        for m in messages:
            if m.priority:
                check_priority(m.priority)
        sampler = self._sampler
        traced = batch_trace(sampler.tracing, topic, messages, sampler.picks)
        if traced is None:
            return await self._sender.send_group(topic, messages, ordered, queue_selector)
        try:
            results = await self._sender.send_group(topic, traced.messages, ordered,
                                                      queue_selector)
        except BaseException as exc:
            traced.finish(None, exc)
            raise
        traced.finish(results)
        return results

    def send_oneway(self, topic: str, body: bytes, key: str | None = None,
                    tags: str | None = None, properties: Mapping[str, str] | None = None) -> bool:
        """Send without waiting for or receiving any acknowledgement (may be lost).

        Returns False, and drops the message with a (rate-limited) warning, when
        the producer's buffer is full: a one-way send never waits.
        """
        self._check_started()
        check_body(body)
        msg = Message(body=body, key=key, tags=tags, properties=properties or {})
        encoded = encode_messages([to_wire(msg)])
        return self._sender.send_oneway(topic, encoded)

    async def cancel_delayed(self, msg_id: str) -> None:
        """Cancel a delayed message (`msg_id`: its SendResult's) before it is due.

        Raises AlreadyDeliveredError once it was delivered to its topic, and
        MessageNotFoundError when the delay scheduler knows no such message.
        """
        await self._scheduler.cancel(msg_id)

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

    # -- loop and tracing ---------------------------------------------------------------------
    def _bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Make `send`'s futures for `loop`, the one the producer runs in (`start` binds it).

        A producer lives in one loop (its connections and tasks do), so `send`
        does not ask for the running loop each time: in CPython 3.11 that asks
        the OS for the process id (a system call) on every call. asyncio's own
        loop builds futures as its `create_future` does, minus that Python call;
        any other loop (uvloop) by its own method.
        """
        if type(loop).create_future is asyncio.BaseEventLoop.create_future:
            self._new_future = functools.partial(asyncio.Future, loop=loop)
        else:
            self._new_future = loop.create_future

    def _first_future(self) -> asyncio.Future[Any]:
        """`_new_future` before the producer is bound to a loop (not started by `start`)."""
        self._bind_loop(_get_running_loop())
        return self._new_future()

    @property
    def _tracing(self) -> Tracing:
        """The tracing this producer's spans go to (replacing it restarts the sampling)."""
        return self._sampler.tracing

    @_tracing.setter
    def _tracing(self, tr: Tracing) -> None:
        self._sampler.use(tr)

"""Consumer retries: the group's retry policy, positions whose outcome is pending, SEND_BACK.

A nacked record goes back to the broker that stores it with SEND_BACK
(docs/protocol.md, 21), which names the record (its queue, offset and id),
not its content: the broker copies its own stored record to `%RETRY%<group>`
(through `%SCHEDULE%` when the back-off is above 0) or, past
`max_reconsume_times`, to `%DLQ%<group>`. Until the broker acknowledged that
copy, the record's position is held in `PendingOffsets`, and the consumer
commits no queue past its lowest pending offset: a consumer that dies
meanwhile leaves the message to be delivered again, never lost. A send-back
that fails is tried again on the record's broker (its master now: a promoted
slave holds the same log), with growing back-off, until it succeeds, the
broker refuses it for good (a non-retriable error: raised, the position stays
pending) or the consumer stops.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import Span

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import RouteCache
from ferry.client.core.tracing import end_settle, start_settle
from ferry.codec import TRACEPARENT, TRACESTATE
from ferry.errors import (
    AccessDeniedError,
    FerryError,
    InvalidDelayError,
    InvalidNameError,
    MalformedRequestError,
    MessageNotFoundError,
)
from ferry.telemetry import inject
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

#: The group config's defaults (ferry.routing.models.GroupConfig: retry_max and
#: retry_backoff_ms), used when the group has no config in namesrv. The client does
#: not import the etcd-side models; tests/client/test_retry.py holds the two equal.
DEFAULT_MAX_RECONSUME_TIMES = 16
DEFAULT_RETRY_BACKOFF_MS: tuple[int, ...] = (
    10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000, 420_000, 480_000,
    540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000)
#: Waits between attempts of one failing send-back: doubling from the first to the last.
SEND_BACK_FIRST_BACKOFF_MS = 100
SEND_BACK_MAX_BACKOFF_MS = 10_000
#: Answers to a SEND_BACK that another attempt would get again (the record is not
#: where it was read, or this identity may not send it back): raised at once.
_REFUSED_FOR_GOOD = (MessageNotFoundError, AccessDeniedError, MalformedRequestError,
                    InvalidNameError)
_STOPPED = ("the consumer stopped before the nack of {} was stored; its position is not "
            "committed, so it will be delivered again")


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and after what wait a nacked message of the group comes back."""

    max_reconsume_times: int = DEFAULT_MAX_RECONSUME_TIMES
    backoff_ms: tuple[int, ...] = DEFAULT_RETRY_BACKOFF_MS

    def __post_init__(self) -> None:
        if self.max_reconsume_times < 0:
            raise ValueError("max_reconsume_times must be >= 0")
        if not self.backoff_ms or any(b < 0 for b in self.backoff_ms):
            raise ValueError("retry_backoff_ms must be a non-empty list of values >= 0")

    def delay_for(self, attempt: int) -> int:
        """The back-off before redelivery `attempt` (1-based); beyond the list, its last."""
        steps = self.backoff_ms
        return steps[min(max(attempt, 1), len(steps)) - 1]

    @classmethod
    def from_group(cls, config: Mapping[str, Any] | None, *,
                   max_reconsume_times: int | None = None,
                   retry_backoff_ms: Iterable[int] | None = None) -> RetryPolicy:
        """From the group's namesrv config (None: defaults), the consumer's options winning."""
        config = config or {}
        limit = config.get("retry_max", config.get("max_reconsume_times",
                                                   DEFAULT_MAX_RECONSUME_TIMES))
        backoff = config.get("retry_backoff_ms") or DEFAULT_RETRY_BACKOFF_MS
        if max_reconsume_times is not None:
            limit = max_reconsume_times
        if retry_backoff_ms is not None:
            backoff = retry_backoff_ms
        return cls(int(limit), tuple(int(b) for b in backoff))


class PendingOffsets:
    """Offsets per queue whose outcome the broker has not stored yet.

    Commits stop below the lowest (`clamp`). A queue holds a handful at most
    (nacks in flight, `run()` handlers), so the lowest is found by a scan.
    """

    def __init__(self) -> None:
        self._by_queue: dict[TopicQueue, Counter[int]] = {}

    def add(self, tq: TopicQueue, offset: int) -> None:
        self._by_queue.setdefault(tq, Counter())[offset] += 1

    def discard(self, tq: TopicQueue, offset: int) -> None:
        counts = self._by_queue.get(tq)
        if counts is None or offset not in counts:
            return
        counts[offset] -= 1
        if counts[offset] <= 0:
            del counts[offset]
            if not counts:
                del self._by_queue[tq]

    def floor(self, tq: TopicQueue) -> int | None:
        counts = self._by_queue.get(tq)
        return min(counts) if counts else None

    def clamp(self, tq: TopicQueue, offset: int) -> int:
        """`offset`, or the lowest pending offset of `tq` when that is lower."""
        low = self.floor(tq)
        return offset if low is None or offset <= low else low

    def __len__(self) -> int:
        return sum(sum(c.values()) for c in self._by_queue.values())


def send_back_fields(record: ConsumerRecord, group: str, *, reconsume_times: int,
                     delay_ms: int, max_reconsume_times: int,
                     span: Span | None = None) -> dict[str, Any]:
    """The SEND_BACK fields naming `record` where it is stored (the request has no body).

    A traced record's copy carries the send-back span's context (`traceparent`,
    `tracestate`), so its later hops are children of `retry`.
    """
    fields: dict[str, Any] = {
        "group": group, "topic": record.stored_topic, "queue_id": record.queue_id,
        "queue_offset": record.queue_offset, "msg_id": record.msg_id,
        "reconsume_times": reconsume_times, "delay_ms": delay_ms,
        "max_reconsume_times": max_reconsume_times}
    if span is not None:
        context: dict[str, str] = {}
        inject(context, trace.set_span_in_context(span))
        if TRACEPARENT in context:
            fields["traceparent"] = context[TRACEPARENT]
            if context.get(TRACESTATE):
                fields["tracestate"] = context[TRACESTATE]
    return fields


def check_delay(delay_ms: object) -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise InvalidDelayError(f"delay_ms must be an integer >= 0, got {delay_ms!r}")
    return delay_ms


class SendBack:
    """SEND_BACK of nacked records to the broker that stores each, tried again until it
    stores them, refuses them for good, or this is closed."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, group: str) -> None:
        self.pool = pool
        self.routes = routes
        self.group = group
        self.closed = False

    async def send(self, record: ConsumerRecord, *, reconsume_times: int, delay_ms: int,
                   max_reconsume_times: int) -> dict[str, Any]:
        """Store the copy; returns the broker's answer (`target`, `queue_offset`)."""
        span = start_settle(record, self.group, reconsume_times, max_reconsume_times)
        fields = send_back_fields(record, self.group, reconsume_times=reconsume_times,
                                  delay_ms=delay_ms, max_reconsume_times=max_reconsume_times,
                                  span=span)
        if span is None:
            return await self._send(record, fields)
        try:
            answer = await self._send(record, fields)
        except BaseException as exc:
            end_settle(span, None, exc)
            raise
        end_settle(span, answer)
        return answer

    async def _send(self, record: ConsumerRecord, fields: dict[str, Any]) -> dict[str, Any]:
        reconsume_times = fields["reconsume_times"]
        backoff_ms = SEND_BACK_FIRST_BACKOFF_MS
        while not self.closed:
            addr = await self._master_of(record)
            if addr:
                try:
                    resp = await self.pool.request(addr, RequestCode.SEND_BACK, fields)
                    return dict(resp.fields)
                except FerryError as exc:
                    if isinstance(exc, _REFUSED_FOR_GOOD):
                        raise   # trying again cannot help: the position stays pending
                    log.warning("send-back of %s (attempt %d) to %s failed: %s",
                                record.msg_id, reconsume_times, addr, exc)
            if self.closed:
                break
            self.routes.invalidate(record.stored_topic)
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, SEND_BACK_MAX_BACKOFF_MS)
        raise FerryError(_STOPPED.format(record.msg_id))

    async def _master_of(self, record: ConsumerRecord) -> str | None:
        """The address of the master of the broker that stores `record` (None: not known now)."""
        try:
            route = await self.routes.route(record.stored_topic)
        except FerryError as exc:
            log.info("no route for %s now: %s", record.stored_topic, exc)
            return None
        return route.broker_addr(record.broker) or None


class Nacker:
    """A consumer's nacks: the retry policy, the send-backs in flight, their pending positions."""

    def __init__(self, send_back: SendBack, pending: PendingOffsets, *,
                 max_reconsume_times: int | None = None,
                 retry_backoff_ms: Iterable[int] | None = None) -> None:
        self.send_back = send_back
        self.pending = pending
        self._max_option = max_reconsume_times
        self._backoff_option = tuple(retry_backoff_ms) if retry_backoff_ms is not None else None
        # Options alone until the group's config is read (validated here, at construction).
        self.policy = RetryPolicy.from_group(None, max_reconsume_times=max_reconsume_times,
                                             retry_backoff_ms=self._backoff_option)
        self.configured = False
        self._tasks: set[asyncio.Task[dict[str, Any]]] = set()
        #: Called with (the record's broker, the copy's target topic, the back-off in ms)
        #: once a broker stored a copy: the consumer's assignment then looks for the
        #: retry queue on that broker if it does not serve it yet (`Assignment.expect_retry`).
        self.on_stored: Callable[[str, str, int], None] | None = None

    def configure(self, group_config: Mapping[str, Any] | None) -> None:
        """Take the group's namesrv config (None: the group has none); options still win."""
        self.policy = RetryPolicy.from_group(group_config, max_reconsume_times=self._max_option,
                                             retry_backoff_ms=self._backoff_option)
        self.configured = True

    async def nack(self, record: ConsumerRecord, delay_ms: int | None = None) -> dict[str, Any]:
        """Send `record` back; returns once a broker stored the copy (its answer).

        The record's position stays pending (uncommitted) until then; if the
        consumer stops first this raises, and the position is never committed.
        """
        if self.send_back.closed:
            raise FerryError("the consumer is stopped: nack is no longer possible")
        attempt = record.reconsume_times + 1
        delay = self.policy.delay_for(attempt) if delay_ms is None else check_delay(delay_ms)
        tq, offset = record.topic_queue, record.queue_offset
        self.pending.add(tq, offset)
        task = asyncio.get_running_loop().create_task(self._send(record, tq, attempt, delay))
        self._tasks.add(task)
        task.add_done_callback(self._settled)
        # shielded: a caller that gives up waiting does not abandon the send-back
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if task.cancelled() and (current is None or not current.cancelling()):
                raise FerryError(_STOPPED.format(record.msg_id)) from None
            raise

    async def _send(self, record: ConsumerRecord, tq: TopicQueue, attempt: int,
                    delay_ms: int) -> dict[str, Any]:
        answer = await self.send_back.send(
            record, reconsume_times=attempt, delay_ms=delay_ms,
            max_reconsume_times=self.policy.max_reconsume_times)
        self.pending.discard(tq, record.queue_offset)   # stored: commits may pass it now
        if self.on_stored is not None:
            self.on_stored(record.broker, str(answer.get("target", "")), delay_ms)
        log.debug("nacked %s (attempt %d, back-off %d ms) -> %s", record.msg_id, attempt,
                  delay_ms, answer.get("target"))
        return answer

    def _settled(self, task: asyncio.Task[dict[str, Any]]) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()   # retrieved: a caller that gave up waiting is not warned about

    async def close(self, grace_ms: int) -> None:
        """Wait up to `grace_ms` for send-backs in flight, then stop the rest (left pending)."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=grace_ms / 1000)
        self.send_back.closed = True
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

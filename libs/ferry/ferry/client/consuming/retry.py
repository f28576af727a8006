"""Consumer retries: the group's retry policy, positions whose outcome is pending, SEND_BACK.

A nacked record goes back to a broker with SEND_BACK (docs/protocol.md, 21):
the broker stores a copy in `%RETRY%<group>` (through `%SCHEDULE%` when the
back-off is above 0) or, past `max_reconsume_times`, in `%DLQ%<group>`. Until
a broker acknowledged that copy, the record's position is held in
`PendingOffsets`, and the consumer commits no queue past its lowest pending
offset: a consumer that dies meanwhile leaves the message to be delivered
again, never lost. A send-back that fails is tried again, on the record's
broker and then on every other master broker known (any broker accepts
SEND_BACK), with growing back-off, until it succeeds or the consumer stops.
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
from ferry.client.core.namesrv import RouteCache, TopicRoute
from ferry.client.core.tracing import TRACED, end_settle, start_settle
from ferry.codec.properties import encode_properties
from ferry.errors import FerryError, InvalidDelayError
from ferry.telemetry import inject
from ferry.wire import RequestCode, WireMessage, encode_messages

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


def send_back_entry(record: ConsumerRecord, span: Span | None = None) -> bytes:
    """The record as one SEND entry: same id, born time, tags, keys, properties, body.

    A traced record's copy carries the send-back span's context instead of its
    own (and the TRACED flag), so its later hops are children of `retry`.
    """
    props = dict(record.properties)
    flags = 0
    if span is not None:
        inject(props, trace.set_span_in_context(span))
        flags = TRACED
    return encode_messages([WireMessage(
        body=record.body, msg_id=bytes.fromhex(record.msg_id), born_ts_ms=record.born_ts_ms,
        tags=record.tags or "", keys=" ".join(record.keys), flags=flags,
        properties=encode_properties(props) if props else b"")])


def check_delay(delay_ms: object) -> int:
    if isinstance(delay_ms, bool) or not isinstance(delay_ms, int) or delay_ms < 0:
        raise InvalidDelayError(f"delay_ms must be an integer >= 0, got {delay_ms!r}")
    return delay_ms


class SendBack:
    """SEND_BACK of nacked records, tried again until a broker stores them or it is closed."""

    def __init__(self, pool: ConnectionPool, routes: RouteCache, group: str,
                 known_routes: Callable[[], Iterable[TopicRoute]]) -> None:
        self.pool = pool
        self.routes = routes
        self.group = group
        self.known_routes = known_routes
        self.closed = False

    async def send(self, record: ConsumerRecord, *, reconsume_times: int, delay_ms: int,
                   max_reconsume_times: int) -> dict[str, Any]:
        """Store the copy; returns the broker's answer (`target`, `queue_offset`)."""
        fields = {"group": self.group, "topic": record.stored_topic,
                  "reconsume_times": reconsume_times, "delay_ms": delay_ms,
                  "max_reconsume_times": max_reconsume_times}
        span = start_settle(record, self.group, reconsume_times, max_reconsume_times)
        body = send_back_entry(record, span)
        if span is None:
            return await self._send(record, fields, body)
        try:
            answer = await self._send(record, fields, body)
        except BaseException as exc:
            end_settle(span, None, exc)
            raise
        end_settle(span, answer)
        return answer

    async def _send(self, record: ConsumerRecord, fields: dict[str, Any], body: bytes
                    ) -> dict[str, Any]:
        reconsume_times = fields["reconsume_times"]
        backoff_ms = SEND_BACK_FIRST_BACKOFF_MS
        attempt = 0
        while not self.closed:
            addrs = await self._candidates(record)
            for addr in addrs[attempt % len(addrs):] if addrs else ():
                try:
                    resp = await self.pool.request(addr, RequestCode.SEND_BACK, fields, body)
                    return dict(resp.fields)
                except FerryError as exc:
                    log.warning("send-back of %s (attempt %d) to %s failed: %s",
                                record.msg_id, reconsume_times, addr, exc)
                    if self.closed:
                        break
            attempt += 1
            self.routes.invalidate(record.stored_topic)
            await asyncio.sleep(backoff_ms / 1000)
            backoff_ms = min(backoff_ms * 2, SEND_BACK_MAX_BACKOFF_MS)
        raise FerryError(_STOPPED.format(record.msg_id))

    async def _candidates(self, record: ConsumerRecord) -> list[str]:
        """The record's own broker first, then every other master known."""
        first: list[str] = []
        try:
            route = await self.routes.route(record.stored_topic)
            addr = route.broker_addr(record.broker)
            if addr:
                first.append(addr)
        except FerryError as exc:
            log.info("no route for %s now: %s", record.stored_topic, exc)
        others = sorted({b.master for r in self.known_routes() for b in r.brokers
                         if b.master} - set(first))
        return first + others


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

"""The long-polling pull loop of one queue, feeding a bounded buffer (back-pressure).

One `QueueFetcher` per assigned queue. It PULLs from its position with
`max_wait_ms` (the broker parks the pull until a message arrives), decodes the
records, checks their tag again (a broker older than tag filtering sends every
record), and appends them to its buffer. The topic's subscription (tags and
SQL) travels with each PULL and the broker skips what does not match: an answer
with no records whose `next_offset` is beyond the fetch offset (NO_MATCHED_MESSAGE,
OFFSET_OVERFLOW_ONE after skipped records) moves the position past them, so the
committed offset reaches the queue's end and the lag counts only what this
consumer will receive. When `prefetch_records` are buffered it stops pulling
until the consumer takes some. OFFSET_TOO_SMALL moves the position forward to the
broker's `next_offset` (retention deleted what lay before); errors back off and
retry.

Histories (issue 16): each PULL carries `hist`, the history id of the record
before the fetch offset (from the broker's last answer, or the committed
offset's). HISTORY_DIVERGED (and OFFSET_OVERFLOW_BADLY, whose `next_offset` a
broker now sets at or before its queue's end) may send the fetcher back: it
drops the buffered records at or past that offset, moves `delivered` back
there too, and tells the consumer (`on_rewind`), which lowers the position it
commits. Records are delivered again rather than skipped; each event is one
WARNING with the old and new offset and the reason, and is counted in
`FetchConfig.history_events`.

OFFSET_RESET (issue 25): an operator reset the group's offset of this queue
while this consumer held it; the fetcher drops its buffer and continues at
`next_offset`, and the consumer's position moves there (`on_reset`).

Each fetcher reads from its broker group's master, or from a slave while the
group has no master, the master is unreachable, or the master answered with
`suggest_slave` (see `replicas`, which decides). Records read from a slave
are the same records at the same queue offsets (the slave replicates the
master's commit log byte for byte), so the position carries over both ways.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import BrokerRoute, RouteCache
from ferry.client.core.records import decode_pull_body
from ferry.client.core.replicas import ReadChoice
from ferry.codec import ORIGIN_TOPIC
from ferry.errors import (
    ConnectionLostError,
    FerryError,
    NotMasterError,
    RequestTimeoutError,
    TopicNotFoundError,
)
from ferry.filter import Subscription
from ferry.names import RETRY_PREFIX
from ferry.wire import PullAnswer, PullStatus, RequestCode

log = logging.getLogger(__name__)

_ERROR_BACKOFF_S = 1.0
_EMPTY_FAST_S = 0.05   # an empty answer faster than this is not a long poll: pause a little


_TAKE_ALL: dict[str, Any] = {"tags": None, "sql": None}
# Failures that say "this broker is gone or not serving": read from another of the group.
_UNREACHABLE = (ConnectionLostError, RequestTimeoutError, NotMasterError)


@dataclass(slots=True)
class FetchConfig:
    """How one fetcher pulls (shared by all fetchers of a consumer).

    `subscriptions`: each filtered topic's Subscription (a topic missing takes
    everything); set with `subscribe()` when the consumer starts.
    """

    group: str
    max_count: int = 256
    max_wait_ms: int = 15_000
    request_timeout_ms: int = 30_000
    prefetch_records: int = 1000
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    history_events: int = 0   # times a fetcher went back because a queue's history changed
    _fields: dict[str, dict[str, Any]] = field(default_factory=dict)

    def subscribe(self, subscriptions: dict[str, Subscription]) -> None:
        self.subscriptions = dict(subscriptions)
        self._fields = {t: sub.to_fields() for t, sub in subscriptions.items()}

    def filter_fields(self, topic: str) -> dict[str, Any]:
        """The PULL fields `tags` and `sql` of `topic`."""
        return self._fields.get(topic, _TAKE_ALL)


@dataclass(slots=True)
class _Chunk:
    records: list[ConsumerRecord]
    next_offset: int   # the queue position once every record of the chunk is taken
    taken: int = 0     # records[:taken] were handed out already


#: History changes a fetcher remembers (to name the history of a committed offset).
MAX_HISTORY_MARKS = 16
#: Answers whose `next_offset` may lie before the fetch offset: the fetcher goes back.
_REWIND_STATUSES = frozenset({PullStatus.HISTORY_DIVERGED, PullStatus.OFFSET_OVERFLOW_BADLY})
#: Answers whose `next_offset` moves the fetcher forward past what it cannot read.
_FORWARD_STATUSES = frozenset({PullStatus.OFFSET_TOO_SMALL, PullStatus.OFFSET_OVERFLOW_BADLY})


@dataclass(slots=True)
class QueueFetcher:
    """Pulls one queue into a buffer; the consumer `take()`s from it."""

    tq: TopicQueue
    pool: ConnectionPool
    routes: RouteCache
    config: FetchConfig
    wakeup: asyncio.Event
    fetch_offset: int
    delivered: int = -1          # position after what was taken (the next offset to hand out)
    _chunks: deque[_Chunk] = field(default_factory=deque)
    _buffered: int = 0
    _space: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None
    _route_suspect: bool = True  # look the route up (awaiting namesrv if stale) before the next pull
    choice: ReadChoice = field(default_factory=ReadChoice)   # master or slave (see `replicas`)
    hist: str | None = None      # history of the record at fetch_offset - 1 (None: unknown)
    # Called with (queue, offset) when the fetcher went back: the consumer lowers its position.
    on_rewind: Callable[[TopicQueue, int], None] | None = None
    # Called with (queue, offset) when an operator reset the group's offset (OFFSET_RESET).
    on_reset: Callable[[TopicQueue, int], None] | None = None
    # (first offset, history id) as answers named them, oldest first (see `hist_at`).
    _marks: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.delivered = self.fetch_offset
        self._space.set()
        if self.hist is not None:
            self._marks.append((max(0, self.fetch_offset - 1), self.hist))

    def hist_at(self, offset: int) -> str | None:
        """The history of the record at `offset` as far as this fetcher knows (for commits)."""
        for start, hist in reversed(self._marks):
            if start <= offset:
                return hist
        return None

    @property
    def buffered(self) -> int:
        return self._buffered

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"fetch-{self.tq}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def seek(self, offset: int, keep_hist: bool = False) -> None:
        """Drop the buffer and continue from `offset`.

        A user's seek names no history (the broker checks none: the user chose the
        offset). An internal one (`keep_hist`: the consumer handing records out again,
        runner.py) keeps what this fetcher knows below `offset`, so that the next PULL
        still carries the history of the record before it: a log replaced meanwhile
        sends it back instead of serving it past records it never read."""
        await self.stop()
        self._chunks.clear()
        self._buffered = 0
        self._space.set()
        if keep_hist and offset > 0:
            self.hist = self.hist_at(offset - 1)
            self._marks = [m for m in self._marks if m[0] < offset]
        else:
            self.hist, self._marks = None, []
        self.fetch_offset = self.delivered = offset
        self.start()

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to `max_records` buffered records, oldest first; advances `delivered`."""
        out: list[ConsumerRecord] = []
        chunks = self._chunks
        while chunks and len(out) < max_records:
            chunk = chunks[0]
            start = chunk.taken
            stop = min(len(chunk.records), start + max_records - len(out))
            if stop > start:
                part = chunk.records[start:stop]
                out += part
                chunk.taken = stop
                self.delivered = part[-1].queue_offset + 1
            if stop >= len(chunk.records):
                chunks.popleft()
                self.delivered = max(self.delivered, chunk.next_offset)
        # Chunks with nothing left (skipped offsets) pass now: with no record buffered the
        # consumer does not call take() again, and the position must reach them.
        while chunks and chunks[0].taken >= len(chunks[0].records):
            self.delivered = max(self.delivered, chunks.popleft().next_offset)
        self._buffered -= len(out)
        if self._buffered < self.config.prefetch_records:
            self._space.set()
        return out

    def _push(self, records: list[ConsumerRecord], next_offset: int) -> None:
        if not records and not self._chunks:
            self.delivered = max(self.delivered, next_offset)  # skipped offsets (tag filter)
            return
        self._chunks.append(_Chunk(records, next_offset))
        self._buffered += len(records)
        if self._buffered >= self.config.prefetch_records:
            self._space.clear()
        if records:
            self.wakeup.set()

    def _mark(self, hist: str) -> None:
        """The records from the fetch offset on belong to `hist` (the answer said so)."""
        if self.hist != hist or not self._marks:
            self._marks.append((self.fetch_offset, hist))
            del self._marks[:-MAX_HISTORY_MARKS]
        self.hist = hist

    def _rewind(self, offset: int, hist: str | None, status: str) -> None:
        """Go back to `offset`: the broker's log is not the continuation of what this
        fetcher read past it. Buffered records from there on are dropped (they belong
        to the replaced history), and what was handed out from there is handed out
        again: duplicates, never a gap."""
        old, delivered = self.fetch_offset, self.delivered
        kept: deque[_Chunk] = deque()
        dropped = 0
        for chunk in self._chunks:
            records = [r for r in chunk.records[chunk.taken:] if r.queue_offset < offset]
            dropped += len(chunk.records) - chunk.taken - len(records)
            if records:
                kept.append(_Chunk(records, min(chunk.next_offset, offset)))
        self._chunks = kept
        self._buffered -= dropped
        if self._buffered < self.config.prefetch_records:
            self._space.set()
        self.fetch_offset = offset
        self.delivered = min(self.delivered, offset)
        self._marks = [m for m in self._marks if m[0] < offset]
        self.hist = hist
        if hist is not None:
            self._marks.append((max(0, offset - 1), hist))
        self.config.history_events += 1
        log.warning("%s: the broker's history of this queue changed (%s): offset %d -> %d; "
                    "%d buffered records dropped, delivered position %d -> %d (records from "
                    "%d on are delivered again)", self.tq, status, old, offset, dropped,
                    delivered, self.delivered, offset)
        if self.on_rewind is not None:
            self.on_rewind(self.tq, offset)

    def _reset(self, offset: int) -> None:
        """Continue at `offset`, where an operator reset the group's committed offset
        (`ferry group reset-offsets --force`): what was buffered is dropped, and the
        consumer's position (what it commits next) moves there, forward or back."""
        dropped = self._buffered
        old = self.fetch_offset
        self._chunks.clear()
        self._buffered = 0
        self._space.set()
        self.hist, self._marks = None, []
        self.fetch_offset = self.delivered = offset
        log.warning("%s: the group's offset was reset: %d -> %d (%d buffered records "
                    "dropped)", self.tq, old, offset, dropped)
        if self.on_reset is not None:
            self.on_reset(self.tq, offset)

    async def _run(self) -> None:
        while True:
            await self._space.wait()
            started = time.monotonic()
            try:
                got = await self._pull_once()
            except FerryError as exc:
                log.info("pull from %s failed: %s; retrying", self.tq, exc)
                self.routes.invalidate(self.tq.topic)
                self._route_suspect = True
                await asyncio.sleep(_ERROR_BACKOFF_S)
                continue
            except Exception:  # a bug must not silently stop this queue for good
                log.exception("pull loop of %s failed unexpectedly; retrying", self.tq)
                await asyncio.sleep(_ERROR_BACKOFF_S)
                continue
            if got:
                # The records just buffered go to the application first: the consumer
                # waiting for them runs before this fetcher encodes and writes its
                # next PULL (one loop turn later; that PULL waits at the broker anyway).
                await asyncio.sleep(0)
            elif time.monotonic() - started < _EMPTY_FAST_S:
                await asyncio.sleep(_EMPTY_FAST_S)

    async def _group(self) -> BrokerRoute | None:
        """The queue's broker group, from the cached route while pulls succeed.

        The consumer's rebalance loop refreshes routes every interval, so a pull
        never waits for namesrv because a route merely aged; after a failed pull
        the route is looked up (and refreshed) first.
        """
        route = self.routes.cached(self.tq.topic)
        if self._route_suspect or route is None:
            route = await self.routes.route(self.tq.topic)
            self._route_suspect = False
        return route.broker(self.tq.broker)

    def commit_addr(self) -> str | None:
        """Where this queue's offsets go: the master, or the slave read from while it is gone."""
        route = self.routes.cached(self.tq.topic)
        return self.choice.commit_target(route.broker(self.tq.broker) if route else None)

    async def _pull_once(self) -> bool:
        """One PULL; True when it returned records."""
        c = self.config
        group = await self._group()
        addr = self.choice.choose(group)
        if addr is None:
            self.routes.invalidate(self.tq.topic)
            raise TopicNotFoundError(f"broker {self.tq.broker} has no broker serving "
                                     f"{self.tq.topic} (now)")
        fields = {"group": c.group, "topic": self.tq.topic, "queue_id": self.tq.queue_id,
                  "offset": self.fetch_offset, "max_count": c.max_count,
                  "max_wait_ms": c.max_wait_ms, **c.filter_fields(self.tq.topic)}
        if self.hist is not None:
            fields["hist"] = self.hist
        try:
            resp = await self.pool.request(addr, RequestCode.PULL, fields,
                                           timeout_ms=c.request_timeout_ms)
        except _UNREACHABLE:
            self.choice.on_failure(addr, group)
            raise
        answer = PullAnswer.parse(resp.fields, resp.body, self.fetch_offset)
        status, next_offset, hist = answer.status, answer.next_offset, answer.hist
        if status is PullStatus.OFFSET_RESET:
            self._reset(next_offset)
            return False
        if status in _REWIND_STATUSES and next_offset < self.fetch_offset:
            self._rewind(next_offset, hist, status.value)
            return False
        if hist is not None and next_offset > self.fetch_offset:
            self._mark(hist)
        self.choice.on_answer(addr, group, found=answer.found,
                              suggest_slave=answer.suggest_slave)
        if status is PullStatus.FOUND:
            records = decode_pull_body(answer.body, self.tq.topic, self.tq.broker)
            sub = c.subscriptions.get(self.tq.topic)
            if sub is not None and sub.tags is not None:
                tags = sub.tags
                records = [r for r in records if r.tags in tags]
            if self.tq.topic.startswith(RETRY_PREFIX):
                records = [r.with_topic(r.properties.get(ORIGIN_TOPIC) or r.topic)
                           for r in records]
            self._push(records, next_offset)
            self.fetch_offset = max(self.fetch_offset, next_offset)
            return bool(records)
        if status in _FORWARD_STATUSES:
            # Forward only: OFFSET_TOO_SMALL (retention deleted what lay before), or a
            # broker older than issue 16 answering OFFSET_OVERFLOW_BADLY.
            log.warning("%s: offset %d out of range (%s); moving to %d",
                        self.tq, self.fetch_offset, status.value, next_offset)
            self.fetch_offset = next_offset
            if not self._chunks:
                self.delivered = next_offset
            else:
                self._chunks.append(_Chunk([], next_offset))
            return False
        if next_offset > self.fetch_offset:
            # NO_MATCHED_MESSAGE, OFFSET_OVERFLOW_ONE...: the broker skipped records that do
            # not match; the position passes them (and is committed there).
            self._push([], next_offset)
            self.fetch_offset = next_offset
        return False


def servable(fetchers: Iterable[QueueFetcher],
             levels: Mapping[TopicQueue, int]) -> list[QueueFetcher]:
    """The fetchers with buffered records, without those below a buffered higher level.

    `levels` holds the priority level of every queue above level 0; of each
    (topic, broker), only the highest level with buffered records is served.
    """
    buffered = [f for f in fetchers if f.buffered]
    if not levels or len(buffered) < 2:
        return buffered
    top: dict[tuple[str, str], int] = {}
    for f in buffered:
        where = (f.tq.topic, f.tq.broker)
        top[where] = max(top.get(where, 0), levels.get(f.tq, 0))
    return [f for f in buffered if levels.get(f.tq, 0) == top[(f.tq.topic, f.tq.broker)]]

"""The long-polling pull loop of one queue, feeding a bounded buffer (back-pressure).

One `QueueFetcher` per assigned queue. It PULLs from its position with
`max_wait_ms` (the broker parks the pull until a message arrives), decodes the
records, checks their tag again (two tags can share a hash at the broker), and
appends them to its buffer. When `prefetch_records` are buffered it stops
pulling until the consumer takes some. OFFSET_TOO_SMALL / OFFSET_OVERFLOW_BADLY
move the position to the broker's `next_offset`; errors back off and retry.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from dataclasses import dataclass, field

from ferry.client.connection import ConnectionPool
from ferry.client.message import ConsumerRecord, TopicQueue
from ferry.client.namesrv import RouteCache
from ferry.client.offsets import broker_addr
from ferry.errors import FerryError
from ferry.store.record import iter_records
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

_ERROR_BACKOFF_S = 1.0
_EMPTY_FAST_S = 0.05   # an empty answer faster than this is not a long poll: pause a little


@dataclass(slots=True)
class FetchConfig:
    """How one fetcher pulls (shared by all fetchers of a consumer)."""

    group: str
    max_count: int = 32
    max_wait_ms: int = 15_000
    request_timeout_ms: int = 30_000
    prefetch_records: int = 1000
    tags: list[str] | None = None


@dataclass(slots=True)
class _Chunk:
    records: deque[ConsumerRecord]
    next_offset: int   # the queue position once every record of the chunk is taken


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

    def __post_init__(self) -> None:
        self.delivered = self.fetch_offset
        self._space.set()

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

    async def seek(self, offset: int) -> None:
        """Drop the buffer and continue from `offset`."""
        await self.stop()
        self._chunks.clear()
        self._buffered = 0
        self._space.set()
        self.fetch_offset = self.delivered = offset
        self.start()

    def take(self, max_records: int) -> list[ConsumerRecord]:
        """Up to `max_records` buffered records, oldest first; advances `delivered`."""
        out: list[ConsumerRecord] = []
        while self._chunks and len(out) < max_records:
            chunk = self._chunks[0]
            while chunk.records and len(out) < max_records:
                rec = chunk.records.popleft()
                out.append(rec)
                self.delivered = rec.queue_offset + 1
            if not chunk.records:
                self._chunks.popleft()
                self.delivered = max(self.delivered, chunk.next_offset)
        self._buffered -= len(out)
        if self._buffered < self.config.prefetch_records:
            self._space.set()
        return out

    def _push(self, records: list[ConsumerRecord], next_offset: int) -> None:
        if not records and not self._chunks:
            self.delivered = max(self.delivered, next_offset)  # skipped offsets (tag filter)
            return
        self._chunks.append(_Chunk(deque(records), next_offset))
        self._buffered += len(records)
        if self._buffered >= self.config.prefetch_records:
            self._space.clear()
        if records:
            self.wakeup.set()

    async def _run(self) -> None:
        while True:
            await self._space.wait()
            started = time.monotonic()
            try:
                got = await self._pull_once()
            except FerryError as exc:
                log.info("pull from %s failed: %s; retrying", self.tq, exc)
                self.routes.invalidate(self.tq.topic)
                await asyncio.sleep(_ERROR_BACKOFF_S)
                continue
            except Exception:  # a bug must not silently stop this queue for good
                log.exception("pull loop of %s failed unexpectedly; retrying", self.tq)
                await asyncio.sleep(_ERROR_BACKOFF_S)
                continue
            if not got and time.monotonic() - started < _EMPTY_FAST_S:
                await asyncio.sleep(_EMPTY_FAST_S)

    async def _pull_once(self) -> bool:
        """One PULL; True when it returned records."""
        c = self.config
        addr = await broker_addr(self.routes, self.tq)
        resp = await self.pool.request(addr, RequestCode.PULL, {
            "group": c.group, "topic": self.tq.topic, "queue_id": self.tq.queue_id,
            "offset": self.fetch_offset, "max_count": c.max_count, "max_wait_ms": c.max_wait_ms,
            "tags": c.tags, "sql": None}, timeout_ms=c.request_timeout_ms)
        status = str(resp.fields.get("status", ""))
        next_offset = int(resp.fields.get("next_offset", self.fetch_offset))
        if status == "FOUND":
            records = [ConsumerRecord.from_stored(m, self.tq.broker)
                       for m in iter_records(resp.body)]
            if c.tags is not None:
                records = [r for r in records if r.tags in c.tags]
            self._push(records, next_offset)
            self.fetch_offset = max(self.fetch_offset, next_offset)
            return bool(records)
        if status in ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW_BADLY"):
            log.warning("%s: offset %d out of range (%s); moving to %d",
                        self.tq, self.fetch_offset, status, next_offset)
            self.fetch_offset = next_offset
            if not self._chunks:
                self.delivered = next_offset
            else:
                self._chunks.append(_Chunk(deque(), next_offset))
            return False
        if status == "NO_MATCHED_MESSAGE" and next_offset > self.fetch_offset:
            self._push([], next_offset)
            self.fetch_offset = next_offset
        return False

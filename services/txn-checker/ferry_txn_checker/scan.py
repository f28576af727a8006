"""Scanning %HALF% and %OP%: one long-polling pull loop per broker and queue.

For every broker in the route of `%HALF%` (polled every `route_poll_ms`; no
route yet = no transaction yet), two tasks PULL queue 0 of `%HALF%` and of
`%OP%` as group `ferry-txn-checker`, from the positions in the book (the
checkpoint's), and hand the records to the book. The op loop also stamps how
far the broker's op records are known (`op_synced_ms`): the check loop never
checks a half whose op might still be unread. The half loop pauses while the
book holds `max_open` open halves (memory stays bounded; nothing is skipped).
The route polling, the tasks, the long polls, re-seeks and history ids are the
library's `QueueReader` (ferry.client.reading); this module is its handler.
"""
from __future__ import annotations

import asyncio
import logging
import time

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient, TopicRoute
from ferry.client.reading import Cursor, QueueReader, ReadConfig, ReadQueue
from ferry.codec.record import StoredMessage
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.wire import PullAnswer, RequestCode

from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.scans import BrokerScan
from ferry_txn_checker.state import Book

log = logging.getLogger(__name__)

GROUP = "ferry-txn-checker"
QUEUE_ID = 0  # %HALF% and %OP% have one queue on each broker
FULL_BACKOFF_S = 1.0  # how often a paused half scan looks again
FULL_LOG_INTERVAL_S = 60.0


class BookCursor(Cursor):
    """A scan position kept in the book (and so in the checkpoint and the committed
    low-water marks): `half_next` or `op_next` of one broker, with its history id."""

    def __init__(self, book: Book, scan: BrokerScan, half: bool) -> None:
        self.book, self.scan, self.half = book, scan, half

    @property  # type: ignore[override]
    def hist(self) -> str | None:
        return self.scan.half_hist if self.half else self.scan.op_hist

    @hist.setter
    def hist(self, value: str | None) -> None:
        if self.half:
            self.scan.half_hist = value
        else:
            self.scan.op_hist = value

    @property
    def offset(self) -> int:
        return self.scan.half_next if self.half else self.scan.op_next

    @offset.setter
    def offset(self, value: int) -> None:
        if value == self.offset:
            return
        if self.half:
            self.scan.half_next = value
        else:
            if value < self.scan.op_next:
                self.scan.op_marks.cut(value)
            self.scan.op_next = value
        self.book.dirty = True


class Scanner(QueueReader):
    """Keeps a %HALF% and an %OP% pull task per broker of the %HALF% route."""

    def __init__(self, cfg: CheckerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 book: Book) -> None:
        super().__init__(pool, namesrv, HALF_TOPIC, ReadConfig(
            GROUP, cfg.pull_max_count, cfg.pull_max_wait_ms, cfg.route_poll_ms))
        self.cfg = cfg
        self.book = book
        self._full_logged_at = 0.0
        # One cursor per (broker, topic), kept across tasks: a restarted task keeps the
        # history id of the record before the scan position (issue 16).
        self._cursors: dict[tuple[str, str], BookCursor] = {}
        self._settling: dict[str, asyncio.Lock] = {}

    def _paused(self, broker: str) -> bool:
        if self.book.open_count < self.cfg.max_open:
            return False
        if time.monotonic() - self._full_logged_at > FULL_LOG_INTERVAL_S:
            self._full_logged_at = time.monotonic()
            log.warning("max_open (%d) open halves held: the %%HALF%% scan of %s pauses "
                        "until some resolve (raise FERRY_TXN_CHECKER_MAX_OPEN if memory "
                        "allows)", self.cfg.max_open, broker)
        return True

    def cursor(self, broker: str, topic: str) -> BookCursor:
        """The scan cursor of `topic` (%HALF% or %OP%) on `broker`."""
        key = (broker, topic)
        if key not in self._cursors:
            self._cursors[key] = BookCursor(self.book, self.book.broker(broker),
                                            topic == HALF_TOPIC)
        return self._cursors[key]

    # -- QueueReader hooks ---------------------------------------------------------------------

    def queues(self, route: TopicRoute) -> list[ReadQueue]:
        """Queue 0 of %HALF% and of %OP% on every master of the %HALF% route."""
        want = [ReadQueue(b.name, b.master, topic, QUEUE_ID) for b in route.brokers
                if b.master for topic in (HALF_TOPIC, OP_TOPIC)]
        for q in want:
            self.book.broker(q.broker, settled=False)
        return want

    async def open(self, queue: ReadQueue) -> Cursor:
        scan = self.book.broker(queue.broker, settled=False)
        if not scan.settled:
            async with self._settling.setdefault(queue.broker, asyncio.Lock()):
                if not scan.settled:  # the other queue's task may have done it
                    await self._settle(queue, scan)
        return self.cursor(queue.broker, queue.topic)

    async def _settle(self, queue: ReadQueue, scan: BrokerScan) -> None:
        """Start a broker new to this book at the low-water marks committed on it
        (QUERY_OFFSET of group ferry-txn-checker, with their history ids); 0 where none.
        A failure raises: the reader tries again after a pause."""
        marks = []
        for topic in (HALF_TOPIC, OP_TOPIC):
            resp = await self.pool.request(queue.addr, RequestCode.QUERY_OFFSET, {
                "group": GROUP, "topic": topic, "queue_id": QUEUE_ID})
            offset, hist = int(resp.fields.get("offset", -1)), resp.fields.get("hist")
            marks.append((max(0, offset), hist if offset > 0 and isinstance(hist, str)
                          else None))
        (scan.half_next, scan.half_hist), (scan.op_next, scan.op_hist) = marks
        scan.settled = True
        self.book.dirty = True
        log.info("scan of %s starts at the committed low-water marks", queue.broker, extra={
            "half_next": scan.half_next, "op_next": scan.op_next,
            "half_hist": scan.half_hist, "op_hist": scan.op_hist})

    async def ready(self, queue: ReadQueue) -> bool:
        while queue.topic == HALF_TOPIC and self._paused(queue.broker):
            await asyncio.sleep(FULL_BACKOFF_S)
        return True

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        # The history of the record before the first one is the cursor's (asked with it).
        prev = self.cursor(queue.broker, queue.topic).hist
        if queue.topic == HALF_TOPIC:
            return self.book.add_halves(queue.broker, records, answer.next_offset,
                                        answer.hist, prev)
        self.book.add_ops(queue.broker, records, answer.next_offset, answer.hist, prev)
        return self.book.broker(queue.broker).op_next

    def answered(self, queue: ReadQueue, answer: PullAnswer, sent_ms: int) -> None:
        if queue.topic == OP_TOPIC and answer.at_end:
            # Every op stored before this PULL was sent has now been seen.
            scan = self.book.broker(queue.broker)
            scan.op_synced_ms = max(scan.op_synced_ms, sent_ms)

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
from ferry.wire import PullAnswer

from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.state import Book, BrokerScan

log = logging.getLogger(__name__)

GROUP = "ferry-txn-checker"
QUEUE_ID = 0  # %HALF% and %OP% have one queue on each broker
FULL_BACKOFF_S = 1.0  # how often a paused half scan looks again
FULL_LOG_INTERVAL_S = 60.0


class BookCursor(Cursor):
    """A scan position kept in the book (and so in the checkpoint): `half_next` or
    `op_next` of one broker; the history id lives only here (issue 23 adds it to the
    checkpoint)."""

    def __init__(self, book: Book, scan: BrokerScan, half: bool) -> None:
        self.book, self.scan, self.half = book, scan, half
        self.hist: str | None = None

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
            self.book.broker(q.broker)
        return want

    async def open(self, queue: ReadQueue) -> Cursor:
        return self.cursor(queue.broker, queue.topic)

    async def ready(self, queue: ReadQueue) -> bool:
        while queue.topic == HALF_TOPIC and self._paused(queue.broker):
            await asyncio.sleep(FULL_BACKOFF_S)
        return True

    async def take(self, queue: ReadQueue, records: list[StoredMessage],
                   answer: PullAnswer) -> int:
        if queue.topic == HALF_TOPIC:
            return self.book.add_halves(queue.broker, records, answer.next_offset)
        self.book.add_ops(queue.broker, records, answer.next_offset)
        return self.book.broker(queue.broker).op_next

    def answered(self, queue: ReadQueue, answer: PullAnswer, sent_ms: int) -> None:
        if queue.topic == OP_TOPIC and answer.at_end:
            # Every op stored before this PULL was sent has now been seen.
            scan = self.book.broker(queue.broker)
            scan.op_synced_ms = max(scan.op_synced_ms, sent_ms)

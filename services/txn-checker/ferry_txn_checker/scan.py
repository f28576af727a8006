"""Scanning %HALF% and %OP%: one long-polling pull loop per broker and queue.

For every broker in the route of `%HALF%` (polled every `route_poll_ms`; no
route yet = no transaction yet), two tasks PULL queue 0 of `%HALF%` and of
`%OP%` as group `ferry-txn-checker`, from the positions in the book (the
checkpoint's), and hand the records to the book. The op loop also stamps how
far the broker's op records are known (`op_synced_ms`): the check loop never
checks a half whose op might still be unread. The half loop pauses while the
book holds `max_open` open halves (memory stays bounded; nothing is skipped).
"""
from __future__ import annotations

import asyncio
import logging
import time

from ferry.client.connection import ConnectionPool
from ferry.client.namesrv import NamesrvClient, TopicRoute
from ferry.codec import iter_records
from ferry.errors import CorruptRecordError, FerryError, MessageNotFoundError, TopicNotFoundError
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.service.lifecycle import KeyedTasks
from ferry.wire import RequestCode

from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.state import Book

log = logging.getLogger(__name__)

GROUP = "ferry-txn-checker"
QUEUE_ID = 0  # %HALF% and %OP% have one queue on each broker
ERROR_BACKOFF_S = 1.0
FULL_BACKOFF_S = 1.0  # how often a paused half scan looks again
FULL_LOG_INTERVAL_S = 60.0
PULL_SLACK_MS = 5000  # how long past the long-poll wait a PULL may take
_CAUGHT_UP = ("NO_MESSAGE_IN_QUEUE", "OFFSET_OVERFLOW_ONE", "NO_MATCHED_MESSAGE")
# HISTORY_DIVERGED (the broker's log is not the continuation of what was read, issue 16)
# and OFFSET_OVERFLOW_BADLY (now the start of the queue's newest history, never its end)
# may move the position back: halves and ops are read again rather than skipped.
_NEEDS_RESEEK = ("OFFSET_TOO_SMALL", "OFFSET_OVERFLOW_BADLY", "HISTORY_DIVERGED")


def now_ms() -> int:
    return int(time.time() * 1000)


async def fetch_route(namesrv: NamesrvClient, topic: str) -> TopicRoute | None:
    """A topic's route; None when namesrv has none."""
    try:
        return await namesrv.get_route(topic)
    except (TopicNotFoundError, MessageNotFoundError):
        return None


class Scanner:
    """Keeps a %HALF% and an %OP% pull task per broker of the %HALF% route."""

    def __init__(self, cfg: CheckerConfig, pool: ConnectionPool, namesrv: NamesrvClient,
                 book: Book) -> None:
        self.cfg = cfg
        self.pool = pool
        self.namesrv = namesrv
        self.book = book
        #: broker name -> master address, from the last %HALF% route
        self.brokers: dict[str, str] = {}
        self._tasks: KeyedTasks[tuple[str, str, str]] = KeyedTasks()
        self._full_logged_at = 0.0
        # (broker, topic) -> history id of the record before the scan position (issue 16)
        self._hists: dict[tuple[str, str], str] = {}

    async def run(self) -> None:
        while True:
            try:
                await self.reconcile()
            except asyncio.CancelledError:
                raise
            except Exception:  # the loop must outlive any one failure
                log.exception("reconciling the scan tasks failed; going on")
            await asyncio.sleep(self.cfg.route_poll_ms / 1000)

    async def reconcile(self) -> None:
        """Match the pull tasks to the current %HALF% route."""
        try:
            route = await fetch_route(self.namesrv, HALF_TOPIC)
        except FerryError as exc:
            log.warning("cannot read the %%HALF%% route: %s", exc)
            return
        if route is None:
            return
        self.brokers = {b.name: b.master for b in route.brokers if b.master}
        want = {(name, addr, topic) for name, addr in self.brokers.items()
                for topic in (HALF_TOPIC, OP_TOPIC)}
        for key in want:
            self.book.broker(key[0])
        await self._tasks.reconcile(want, lambda key: self._pull_loop(*key),
                                    lambda key: f"scan-{key[0]}-{key[2]}")

    async def stop(self) -> None:
        await self._tasks.stop()

    @property
    def pulling(self) -> int:
        return len(self._tasks)

    def _paused(self, broker: str) -> bool:
        if self.book.open_count < self.cfg.max_open:
            return False
        if time.monotonic() - self._full_logged_at > FULL_LOG_INTERVAL_S:
            self._full_logged_at = time.monotonic()
            log.warning("max_open (%d) open halves held: the %%HALF%% scan of %s pauses "
                        "until some resolve (raise FERRY_TXN_CHECKER_MAX_OPEN if memory "
                        "allows)", self.cfg.max_open, broker)
        return True

    async def _pull_loop(self, broker: str, addr: str, topic: str) -> None:
        scan = self.book.broker(broker)
        half = topic == HALF_TOPIC
        fields = {"group": GROUP, "topic": topic, "queue_id": QUEUE_ID,
                  "max_count": self.cfg.pull_max_count, "max_wait_ms": self.cfg.pull_max_wait_ms,
                  "tags": None, "sql": None}
        while True:
            try:
                if half and self._paused(broker):
                    await asyncio.sleep(FULL_BACKOFF_S)
                    continue
                offset = scan.half_next if half else scan.op_next
                sent_ms = now_ms()
                hist = self._hists.get((broker, topic))
                resp = await self.pool.request(
                    addr, RequestCode.PULL,
                    {**fields, "offset": offset, **({"hist": hist} if hist else {})},
                    timeout_ms=self.cfg.pull_max_wait_ms + PULL_SLACK_MS)
                self._take(broker, half, offset, sent_ms, resp.fields, resp.body)
                # The history of the record before the position now (issue 16); a
                # position read from the checkpoint names none until the first answer.
                got, now_at = resp.fields.get("hist"), scan.half_next if half else scan.op_next
                if isinstance(got, str) and now_at == resp.fields.get("next_offset"):
                    self._hists[(broker, topic)] = got
                elif now_at != offset:
                    self._hists.pop((broker, topic), None)
            except asyncio.CancelledError:
                raise
            except (FerryError, CorruptRecordError, OSError) as exc:
                log.warning("pull of %s from %s failed: %s", topic, broker, exc)
                await asyncio.sleep(ERROR_BACKOFF_S)

    def _take(self, broker: str, half: bool, offset: int, sent_ms: int,
              fields: dict[str, object], body: bytes | memoryview) -> None:
        scan = self.book.broker(broker)
        status = str(fields.get("status", ""))
        next_offset = int(fields.get("next_offset", offset))  # type: ignore[call-overload]
        max_offset = int(fields.get("max_offset", next_offset))  # type: ignore[call-overload]
        if status == "FOUND":
            records = list(iter_records(body))
            if half:
                self.book.add_halves(broker, records, next_offset)
            else:
                self.book.add_ops(broker, records, next_offset)
        elif status in _NEEDS_RESEEK:
            log.warning("%s on %s: offset %d %s; continuing at %d",
                        "%HALF%" if half else "%OP%", broker, offset, status, next_offset)
            if half:
                scan.half_next = next_offset
            else:
                scan.op_next = next_offset
            self.book.dirty = True
        elif status == "NO_MATCHED_MESSAGE" and not half:
            scan.op_next = max(scan.op_next, next_offset)
        if not half and (status in _CAUGHT_UP or next_offset >= max_offset):
            # Every op stored before this PULL was sent has now been seen.
            scan.op_synced_ms = max(scan.op_synced_ms, sent_ms)

"""Leadership: only the elected txn-checker scans, checks and commits its marks.

Every instance runs the election (`ferry.routing.election.Election`, key
`<etcd_prefix>leaders/txn-checker`, lease TTL `leader_ttl_s`; with `etcd`
empty the one instance always leads). A standby serves its HTTP API from the
book it last had and sends nothing to the brokers. A term:

1. the book is trusted only if it holds the state of the term just before
   (its `epoch` is the new epoch - 1: this instance led last, nobody since);
   otherwise its positions and open halves are dropped (`forget_positions`),
   and each broker is read again from the low-water marks committed on it
   (scan.py `_settle`, scans.py);
2. a `Scanner` and a `Checker` run; every `checkpoint_interval_ms` the
   low-water marks of %HALF% and %OP%, with their history ids, are committed
   to each broker (COMMIT_OFFSET of group ferry-txn-checker);
3. the term ends when `is_leader` turns False: the election steps down by
   itself at 2/3 of the lease's TTL without a refresh, before etcd can give
   the key to another, and the checker asks `is_leader` right before every
   CHECK and discard it sends. The tasks are cancelled; what was in flight is
   put back in the book.

The design and its reasons: docs/transactions.md, "Leadership and failover".
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.client.reading import now_ms
from ferry.errors import FerryError
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.routing.election import Election
from ferry.tasks import cancel_and_wait
from ferry.wire import RequestCode

from ferry_txn_checker.checker import Checker
from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.scan import GROUP, QUEUE_ID, Scanner
from ferry_txn_checker.state import Book

log = logging.getLogger(__name__)

LEADER_KEY = "leaders/txn-checker"


class Leadership:
    """Runs the election and, while this node leads, a term of scanning and checking."""

    def __init__(self, cfg: CheckerConfig, book: Book, pool: ConnectionPool,
                 namesrv: NamesrvClient, node_id: str) -> None:
        self.cfg, self.book, self.pool, self.namesrv = cfg, book, pool, namesrv
        self.node_id = node_id
        self.election: Election | None = None
        #: The epoch of the term whose state the book holds (the checkpoint's `epoch`).
        self.book_epoch = 0
        self.scanner = self._scanner()
        self.checker = self._checker()
        self.terms = 0  # terms led since the start (for stats)
        self._task: asyncio.Task[None] | None = None
        self._term: dict[str, asyncio.Task[None]] = {}
        self._committed: dict[tuple[str, str], tuple[int, str | None]] = {}

    def _scanner(self) -> Scanner:
        return Scanner(self.cfg, self.pool, self.namesrv, self.book)

    def _checker(self) -> Checker:
        return Checker(self.cfg, self.book, self.pool, lambda: self.scanner.brokers,
                       self.is_leader)

    def is_leader(self) -> bool:
        """True while this node may act as the leader (asked before every action)."""
        return self.election is None or self.election.is_leader

    def describe(self) -> dict[str, Any]:
        """For /v1/stats: this node's role, the leader's id and epoch."""
        el = self.election
        leader = el.leader if el is not None else None
        return {"role": "leader" if self.is_leader() and self._term else "standby",
                "leader": (leader.node_id if leader is not None
                           else self.node_id if el is None else None),
                "leader_http": leader.value.get("http_addr") if leader is not None else None,
                "epoch": el.epoch if el is not None else self.book_epoch,
                "terms": self.terms}

    # -- start / stop ----------------------------------------------------------------

    async def start(self, http_addr: str) -> None:
        """Join the election (or, without etcd, lead at once)."""
        if self.cfg.etcd:
            self.election = Election(self.cfg.etcd, self.cfg.etcd_prefix, LEADER_KEY,
                                     self.node_id, {"http_addr": http_addr},
                                     self.cfg.leader_ttl_s)
            await self.election.start()
        self._task = asyncio.create_task(self._run(), name="leadership")

    async def stop_term(self, drain_s: float) -> None:
        """A clean stop: end the term, letting checks under way finish (`drain_s`)."""
        await self._end_term(drain_s)
        await cancel_and_wait(self._task)  # waiting for news: it starts no new term
        self._task = None

    async def close(self) -> None:
        """After `stop_term` and the last checkpoint: commit the marks, resign."""
        if self.is_leader() and self.terms:
            with contextlib.suppress(FerryError, OSError):
                await self.commit_marks()
        if self.election is not None:
            await self.election.stop()

    # -- terms -----------------------------------------------------------------------

    async def _run(self) -> None:
        while True:
            if self.election is not None:
                await self.election.wait_leading()
            self._begin_term()
            try:
                while self.is_leader():
                    if self.election is None:
                        await asyncio.Event().wait()  # no election: lead until stopped
                    else:
                        await self.election.wait_change()
            finally:
                await self._end_term(0.0)

    def _begin_term(self) -> None:
        epoch = self.election.epoch if self.election is not None else self.book_epoch
        trusted = self.election is None or self.book_epoch == epoch - 1
        if not trusted:
            self.book.forget_positions(now_ms())
        log.info("leading: %s", "resuming from the book" if trusted else
                 "reading every broker again from its committed low-water marks",
                 extra={"node": self.node_id, "epoch": epoch, "book_epoch": self.book_epoch})
        self.book_epoch, self.terms = epoch, self.terms + 1
        self.book.dirty = True
        self.scanner, self.checker = self._scanner(), self._checker()
        self._committed.clear()
        for name, run in (("scan", self.scanner.run), ("check", self.checker.run),
                          ("marks", self._commit_loop)):
            self._term[name] = asyncio.create_task(run(), name=f"txn-{name}")

    async def _end_term(self, drain_s: float) -> None:
        if not self._term:
            return
        log.info("term ended", extra={"node": self.node_id, "epoch": self.book_epoch})
        for name in ("scan", "check", "marks"):
            await cancel_and_wait(self._term.pop(name, None))
        await self.scanner.stop()
        await self.checker.drain(drain_s)

    # -- the low-water marks ---------------------------------------------------------

    async def _commit_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.checkpoint_interval_ms / 1000)
            try:
                await self.commit_marks()
            except (FerryError, OSError) as exc:
                log.debug("committing the low-water marks failed: %s", exc)

    async def commit_marks(self) -> None:
        """COMMIT_OFFSET of group ferry-txn-checker on each broker: the low-water marks
        of %HALF% and %OP% with their history ids (what a new leader starts from)."""
        for name, scan in list(self.book.brokers.items()):
            addr = self.scanner.brokers.get(name)
            if addr is None or not scan.settled:
                continue
            for topic, (offset, hist) in zip((HALF_TOPIC, OP_TOPIC), scan.low_water(),
                                             strict=True):
                if self._committed.get((name, topic)) == (offset, hist):
                    continue
                if not self.is_leader():
                    return  # fenced: a deposed leader writes nothing
                fields: dict[str, Any] = {"group": GROUP, "topic": topic,
                                          "queue_id": QUEUE_ID, "offset": offset}
                if hist is not None:
                    fields["hist"] = hist
                try:
                    await self.pool.request(addr, RequestCode.COMMIT_OFFSET, fields)
                    self._committed[(name, topic)] = (offset, hist)
                except FerryError as exc:
                    log.debug("commit of %s on %s failed: %s", topic, name, exc)

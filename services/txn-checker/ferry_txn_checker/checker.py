"""The check loop: asks the broker about each due half, and rolls back the hopeless.

A half is due `immunity_ms` after its store time, then `check_interval_ms`
after each check (the book hands it out only once its broker's op records up
to that time have been read). For a half checked fewer than `max_checks`
times: CHECK_TRANSACTION(group, msg_id) to its broker, which pushes the check
to a live producer of the group (`forwarded` true), finds none (`forwarded`
false, `state` "open": it still counts as a check), or answers that the
transaction already ended (`forwarded` false, `state` committed/rolled_back:
dropped, and no producer was asked). After the `max_checks`-th check and one
more interval: END_TRANSACTION(rollback, from_check, by "discarded"). The
checker only ever sends rollback, and the broker refuses a rollback of a
committed transaction (TransactionStateError): it can never end one twice
two ways. A broker that cannot be reached is asked again after
`retry_backoff_ms`, without counting a check. A TRACED half's check (or
discard) is a `check` span (CLIENT) child of the half's trace context, with
its outcome in `ferry.outcome`.

Fencing (docs/transactions.md, "Leadership and failover"): `may_act()` (the
election's `is_leader`, which turns False by itself at 2/3 of the lease's TTL
without a refresh) is asked right before each CHECK and each discard is sent;
a node that no longer leads puts the half back and sends nothing.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from ferry.client.core.connection import ConnectionPool
from ferry.client.reading import now_ms
from ferry.errors import FerryError, MessageNotFoundError, TransactionStateError
from ferry.telemetry import extract, hop_span, tracing
from ferry.wire import RequestCode

from ferry_txn_checker.config import CheckerConfig
from ferry_txn_checker.scans import OpenTxn
from ferry_txn_checker.state import COMMITTED, DISCARDED, ROLLED_BACK, Book

log = logging.getLogger(__name__)

MAX_IDLE_S = 0.2  # the loop looks at the heap at least this often
DEFER_MS = 200  # a half whose op scan is behind is looked at again this much later
_ENDED = (COMMITTED, ROLLED_BACK)


class Fenced(Exception):
    """This node may not act now (it does not lead): nothing was sent."""


class Checker:
    """Runs the checks the book says are due, at most `check_concurrency` at once."""

    def __init__(self, cfg: CheckerConfig, book: Book, pool: ConnectionPool,
                 brokers: Callable[[], dict[str, str]],
                 may_act: Callable[[], bool] = lambda: True) -> None:
        self.cfg = cfg
        self.may_act = may_act
        self.book = book
        self.pool = pool
        self.brokers = brokers
        self.wake = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        while True:
            free = self.cfg.check_concurrency - len(self._inflight)
            if free > 0:
                for txn in self.book.take_due(now_ms(), free, DEFER_MS):
                    task = asyncio.create_task(self._step(txn))
                    self._inflight.add(task)
                    task.add_done_callback(self._done)
            self.wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), self._idle_s())

    def _idle_s(self) -> float:
        nxt = self.book.next_due_ms()
        if nxt is None:
            return MAX_IDLE_S
        return min(MAX_IDLE_S, max(0.0, (nxt - now_ms()) / 1000))

    @property
    def in_flight(self) -> int:
        return len(self._inflight)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self.wake.set()

    async def drain(self, timeout_s: float) -> None:
        """Wait for the checks under way (their outcome is in the book), then give up."""
        if self._inflight:
            await asyncio.wait(set(self._inflight), timeout=timeout_s)
        for task in list(self._inflight):
            task.cancel()

    async def _step(self, txn: OpenTxn) -> None:
        addr = self.brokers().get(txn.broker)
        if addr is None:
            self.book.retry(txn, now_ms() + self.cfg.retry_backoff_ms)
            return
        try:
            if txn.trace is not None and tracing().enabled:
                await self._traced_step(addr, txn)
            elif txn.checks >= self.cfg.max_checks:
                await self._discard(addr, txn)
            else:
                await self._check(addr, txn)
        except asyncio.CancelledError:
            self.book.retry(txn, now_ms())
            raise
        except Fenced:
            self.book.retry(txn, now_ms() + self.cfg.retry_backoff_ms, counted=False)
        except MessageNotFoundError:
            log.warning("transaction %s is no longer on broker %s (retention?); dropped",
                        txn.msg_id, txn.broker)
            self.book.ended(txn, ROLLED_BACK, lost=True)
        except (FerryError, OSError) as exc:
            # A refusal that will not change (e.g. MalformedRequestError) is asked again
            # only every check interval, not every back-off: no log flood.
            retriable = getattr(exc, "retriable", True)
            wait_ms = self.cfg.retry_backoff_ms if retriable else self.cfg.check_interval_ms
            log.warning("check of transaction %s on %s failed: %s; retrying in %d ms",
                        txn.msg_id, txn.broker, exc, wait_ms)
            self.book.retry(txn, now_ms() + wait_ms)
        except Exception:  # never lose the transaction: it stays open and is retried
            log.exception("check of transaction %s failed", txn.msg_id)
            self.book.retry(txn, now_ms() + self.cfg.retry_backoff_ms)

    async def _traced_step(self, addr: str, txn: OpenTxn) -> None:
        """A check (or discard) of a TRACED half, under a `check` span child of its context."""
        discard = txn.checks >= self.cfg.max_checks
        with hop_span("check", destination=txn.topic, msg_id=txn.msg_id,
                      parent=extract(txn.trace or {}),
                      attributes={"ferry.broker": txn.broker, "ferry.txn_group": txn.group,
                                  "ferry.txn_checks": txn.checks}) as span:
            if discard:
                await self._discard(addr, txn)
                span.set_attribute("ferry.outcome", DISCARDED)
            else:
                outcome = await self._check(addr, txn)
                span.set_attribute("ferry.outcome", outcome)

    async def _check(self, addr: str, txn: OpenTxn) -> str:
        """Ask the broker to check `txn`; the outcome (forwarded, no_producer or the
        state of an already ended transaction)."""
        if not self.may_act():
            raise Fenced
        resp = await self.pool.request(addr, RequestCode.CHECK_TRANSACTION, {
            "group": txn.group, "msg_id": bytes.fromhex(txn.msg_id)},
            timeout_ms=self.cfg.check_timeout_ms)
        state = str(resp.fields.get("state", "open"))
        if not resp.fields.get("forwarded") and state in _ENDED:
            log.debug("transaction %s already %s: not checked", txn.msg_id, state)
            self.book.ended(txn, state)
            return state
        self.book.checked(txn, now_ms(), self.cfg.check_interval_ms,
                          bool(resp.fields.get("forwarded")))
        log.info("transaction checked", extra={
            "msg_id": txn.msg_id, "group": txn.group, "broker": txn.broker,
            "checks": txn.checks, "forwarded": bool(resp.fields.get("forwarded"))})
        return "forwarded" if resp.fields.get("forwarded") else "no_producer"

    async def _discard(self, addr: str, txn: OpenTxn) -> None:
        if not self.may_act():  # the one resolution the checker sends on its own
            raise Fenced
        try:
            await self.pool.request(addr, RequestCode.END_TRANSACTION, {
                "group": txn.group, "msg_id": bytes.fromhex(txn.msg_id), "action": "rollback",
                "from_check": True, "by": "discarded"}, timeout_ms=self.cfg.check_timeout_ms)
        except TransactionStateError:
            log.info("transaction %s was committed before its discard", txn.msg_id)
            self.book.ended(txn, COMMITTED)
            return
        log.warning("transaction discarded: rolled back after max_checks", extra={
            "msg_id": txn.msg_id, "group": txn.group, "broker": txn.broker,
            "checks": txn.checks})
        self.book.discard(txn, now_ms())

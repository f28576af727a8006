"""The transactional producer's side of the check-back: states, registration, answering checks.

A producer group registers with every master broker by HEARTBEAT (role
`producer`) every `heartbeat_interval_ms`, on the connection the broker will
use to reach it. When the txn-checker finds a half message left open, the
broker sends a one-way CHECK_TRANSACTION frame on such a connection: its body
is the stored half record. The producer asks its `checker(record)` (the record
shown under its REAL topic and queue) and answers COMMIT or ROLLBACK with
END_TRANSACTION (`from_check` true, `by` "check") to that broker; UNKNOWN
sends nothing, and the txn-checker asks again later.
"""
from __future__ import annotations

import asyncio
import inspect
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any

from ferry.client.core.connection import BrokerConnection, ConnectionPool
from ferry.client.core.message import ConsumerRecord
from ferry.client.core.namesrv import NamesrvClient
from ferry.codec import REAL_QUEUE_ID, REAL_TOPIC, decode_record
from ferry.codec.system_properties import TXN_KEY_PREFIX
from ferry.errors import FerryError
from ferry.wire import Frame, RequestCode

log = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_INTERVAL_MS = 5_000
DEFAULT_CHECK_TIMEOUT_MS = 5_000
#: Checks answered at the same time; more wait for a slot.
MAX_CONCURRENT_CHECKS = 16
#: Checks waiting for a slot; beyond that a check is dropped (the txn-checker asks again).
MAX_QUEUED_CHECKS = 1024


class TxnState(Enum):
    """The state of a local transaction, as `execute` and the checker report it."""

    COMMIT = "commit"
    ROLLBACK = "rollback"
    UNKNOWN = "unknown"


#: What a checker is: given the half record, the local transaction's state.
Checker = Callable[[ConsumerRecord], "TxnState | Awaitable[TxnState]"]


def as_state(value: object, what: str) -> TxnState:
    """A checker's or execute's return value as a TxnState (anything else: UNKNOWN, logged)."""
    if isinstance(value, TxnState):
        return value
    if isinstance(value, str):
        try:
            return TxnState(value.lower())
        except ValueError:
            pass
    log.warning("%s returned %r, not a TxnState: counted as UNKNOWN", what, value)
    return TxnState.UNKNOWN


async def call_for_state(fn: Callable[..., Any], *args: Any, what: str) -> TxnState:
    """Run a plain or coroutine function and read its TxnState.

    A plain function runs inline on the event loop (keep it short, or make it
    a coroutine). An exception counts as UNKNOWN and is logged: the check-back
    decides such a transaction later.
    """
    try:
        value = fn(*args)
        if inspect.isawaitable(value):
            value = await value
    except Exception:
        log.exception("%s raised: counted as UNKNOWN (the check-back will decide)", what)
        return TxnState.UNKNOWN
    return as_state(value, what)


def check_record(frame: Frame, broker: str) -> ConsumerRecord:
    """The half record a CHECK_TRANSACTION carries, shown under its real topic and queue."""
    stored = decode_record(frame.body)
    props = stored.properties
    topic = props.get(REAL_TOPIC) or str(frame.fields.get("topic") or stored.topic)
    try:
        queue_id = int(props.get(REAL_QUEUE_ID, stored.queue_id))
    except ValueError:
        queue_id = stored.queue_id
    # The broker indexes a half under one more key, `TXN:<id>`, appended last: the
    # user's checker sees the keys the message was sent with.
    keys = " ".join(k for k in stored.keys.split(" ") if k and not k.startswith(TXN_KEY_PREFIX))
    return ConsumerRecord.from_stored(
        stored._replace(topic=topic, queue_id=queue_id, keys=keys), broker)


class CheckResponder:
    """Registers a producer group with the brokers and answers their checks."""

    def __init__(self, *, group: str, checker: Checker, pool: ConnectionPool,
                 namesrv: NamesrvClient, end: Callable[..., Awaitable[Any]],
                 heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
                 check_timeout_ms: int = DEFAULT_CHECK_TIMEOUT_MS) -> None:
        if heartbeat_interval_ms <= 0 or check_timeout_ms <= 0:
            raise ValueError("heartbeat_interval_ms and check_timeout_ms must be > 0")
        self.group = group
        self.checker = checker
        self.pool = pool
        self.namesrv = namesrv
        self._end = end
        self.heartbeat_interval_ms = heartbeat_interval_ms
        self.check_timeout_ms = check_timeout_ms
        self.client_id = f"{socket.gethostname()}@{os.getpid()}@{secrets.token_hex(4)}"
        self.extra_addrs: Callable[[], set[str]] = set
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_CHECKS)
        self._checks: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        pool.request_handlers[RequestCode.CHECK_TRANSACTION] = self.on_check

    # -- registration ----------------------------------------------------------------------
    async def start(self) -> None:
        """Register once now (so checks can reach us at once), then on every interval."""
        await self.heartbeat()
        self._loop_task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def stop(self) -> None:
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        checks = list(self._checks)
        for t in checks:
            t.cancel()
        await asyncio.gather(*checks, return_exceptions=True)

    async def _heartbeats(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval_ms / 1000)
            try:
                await self.heartbeat()
            except Exception:   # the loop must outlive any one failure
                log.exception("producer heartbeat round failed")

    async def master_addrs(self) -> set[str]:
        """Every master broker the namesrv lists, plus those of the topics sent to."""
        addrs = set(self.extra_addrs())
        try:
            data = await self.namesrv.call("GET", "/v1/brokers")
            for b in data.get("brokers", []):
                if b.get("id") == 0 and b.get("addr"):
                    addrs.add(b["addr"])
        except FerryError as exc:
            log.info("cannot list brokers: %s", exc)
        return addrs

    async def heartbeat(self) -> None:
        """HEARTBEAT role=producer to every master broker; failures are logged."""
        fields = {"client_id": self.client_id, "group": self.group, "role": "producer",
                  "topics": [], "mode": "clustering"}
        for addr in sorted(await self.master_addrs()):
            try:
                await self.pool.request(addr, RequestCode.HEARTBEAT, fields)
            except FerryError as exc:
                log.info("producer heartbeat to %s failed: %s", addr, exc)

    # -- checks ----------------------------------------------------------------------------
    def on_check(self, conn: BrokerConnection, frame: Frame) -> None:
        """A CHECK_TRANSACTION from a broker: answered in a task (the reader must not wait)."""
        if len(self._checks) >= MAX_CONCURRENT_CHECKS + MAX_QUEUED_CHECKS:
            log.warning("dropping a check from %s: %d checks already waiting (it will be "
                        "asked again)", conn.addr, len(self._checks))
            return
        task = asyncio.get_running_loop().create_task(self._answer(conn.addr, frame))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    async def _answer(self, addr: str, frame: Frame) -> None:
        group = frame.fields.get("group")
        if group != self.group:
            log.warning("check for group %r from %s reached producer group %r: ignored",
                        group, addr, self.group)
            return
        try:
            record = check_record(frame, addr)
        except Exception as exc:
            log.warning("undecodable check from %s ignored: %r", addr, exc)
            return
        async with self._slots:
            try:
                async with asyncio.timeout(self.check_timeout_ms / 1000):
                    state = await call_for_state(self.checker, record, what="checker")
            except TimeoutError:
                log.warning("checker took over %d ms for %s: UNKNOWN", self.check_timeout_ms,
                            record.msg_id)
                state = TxnState.UNKNOWN
        if state is TxnState.UNKNOWN:
            return
        try:
            await self._end(addr, record.msg_id, state, from_check=True, by="check")
        except FerryError as exc:
            log.warning("answering the check of %s (%s) at %s failed: %s",
                        record.msg_id, state.value, addr, exc)

"""The TransactionProducer: half messages, commit / rollback, and the check-back.

    tp = TransactionProducer(group="orders-tx", namesrv=..., checker=check)
    async with tp:
        txn = await tp.begin("orders", body, key="order-42")   # the half is stored
        ...                                                    # the local transaction
        await txn.commit()                                     # or txn.rollback()

`begin` sends one SEND entry flagged TXN_HALF (property TXN_GROUP, and
CHECK_IMMUNITY_MS when given) through the wrapped Producer, so a half is
batched and its queue chosen like any message; the broker keeps it in
`%HALF%`, invisible to consumers. `commit` / `rollback` send END_TRANSACTION
to the broker that stored the half. A transaction neither committed nor
rolled back (the producer died, the answer was lost, the local transaction
said UNKNOWN) is resolved by the check-back: see `txn_checks`.
"""
from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from opentelemetry.context import Context
from opentelemetry.trace import set_span_in_context

from ferry.client.core.base import AsyncClient
from ferry.client.core.connection import DEFAULT_REQUEST_TIMEOUT_MS
from ferry.client.core.message import SendResult
from ferry.client.core.tracing import TRACED, carry, end_with, start_send, wants_trace
from ferry.client.producing.encoding import check_body, make_wire
from ferry.client.producing.producer import Producer
from ferry.client.transactions.txn_checks import (
    DEFAULT_CHECK_TIMEOUT_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    Checker,
    CheckResponder,
    TxnState,
    call_for_state,
)
from ferry.codec import CHECK_IMMUNITY_MS, TXN_GROUP, MessageFlag
from ferry.errors import FerryError, MalformedRequestError
from ferry.names import validate_group
from ferry.telemetry import hop_span
from ferry.telemetry.spans import OUTCOME
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

_TXN_HALF = int(MessageFlag.TXN_HALF)
#: END_TRANSACTION attempts on a retriable failure (connection lost, timeout, busy).
END_ATTEMPTS = 3
END_RETRY_BACKOFF_MS = 200
_STATES = {"committed": TxnState.COMMIT, "rolled_back": TxnState.ROLLBACK}


class Transaction:
    """One open transaction: its half message's id, topic and the broker holding it."""

    def __init__(self, producer: TransactionProducer, result: SendResult, addr: str,
                 context: Context | None = None) -> None:
        self._producer = producer
        self.msg_id = result.msg_id     # the transaction id: the half's (and the message's) id
        self.topic = result.topic
        self.queue_id = result.queue_id
        self.broker = result.broker     # the broker name
        self.addr = addr                # the address the half was stored at
        self.state: TxnState = TxnState.UNKNOWN   # until commit() or rollback() succeeds
        self.context = context          # the half's trace context (a traced transaction)

    @property
    def ended(self) -> bool:
        return self.state is not TxnState.UNKNOWN

    async def commit(self) -> None:
        """Make the message visible in its topic (raises TransactionStateError if rolled back)."""
        self.state = await self._end(TxnState.COMMIT)

    async def rollback(self) -> None:
        """Discard the half message (raises TransactionStateError if committed)."""
        self.state = await self._end(TxnState.ROLLBACK)

    async def _end(self, state: TxnState) -> TxnState:
        if self.context is None:
            return await self._producer.end(self.addr, self.msg_id, state)
        with hop_span("end", destination=self.topic, msg_id=self.msg_id, parent=self.context,
                      attributes={"ferry.broker": self.broker, "ferry.txn_action": state.value}
                      ) as span:
            ended = await self._producer.end(self.addr, self.msg_id, state)
            span.set_attribute(OUTCOME, ended.name.lower())
            return ended

    def __repr__(self) -> str:
        return (f"Transaction(msg_id={self.msg_id!r}, topic={self.topic!r}, "
                f"broker={self.broker!r}, state={self.state.name})")


class TransactionProducer(AsyncClient):
    """Sends transactional messages for one producer group and answers its checks.

    `checker(record)` (plain or coroutine function) tells the state of the
    local transaction of a half message left open; an exception, a timeout
    (`check_timeout_ms`) or an unexpected value counts as UNKNOWN. Other
    keyword arguments go to the wrapped `Producer`.
    """

    def __init__(self, *, group: str, checker: Checker, namesrv: str | None = None,
                 heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
                 check_timeout_ms: int = DEFAULT_CHECK_TIMEOUT_MS,
                 request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS,
                 **producer_options: Any) -> None:
        validate_group(group)
        if not callable(checker):
            raise TypeError("checker must be a function of the half record")
        self.group = group
        self._producer = Producer(namesrv=namesrv, request_timeout_ms=request_timeout_ms,
                                  **producer_options)
        self._pool = self._producer._pool
        self._checks = CheckResponder(
            group=group, checker=checker, pool=self._pool, namesrv=self._producer._namesrv,
            end=self._end, heartbeat_interval_ms=heartbeat_interval_ms,
            check_timeout_ms=check_timeout_ms)
        self._checks.extra_addrs = self._route_addrs
        self._started = False

    @property
    def client_id(self) -> str:
        return self._checks.client_id

    # -- lifecycle -------------------------------------------------------------------------
    async def start(self) -> None:
        await self._producer.start()
        await self._checks.start()
        self._started = True

    async def stop(self) -> None:
        if not self._started:
            return
        self._started = False
        await self._checks.stop()
        await self._producer.stop()


    def _route_addrs(self) -> set[str]:
        """The master brokers of the topics this producer sent to (cached routes)."""
        routes = self._producer._routes
        return {b.master for topic in self._producer._valid_topics
                if (r := routes.cached(topic)) is not None for b in r.brokers if b.master}

    # -- transactions ----------------------------------------------------------------------
    async def begin(self, topic: str, body: bytes, key: str | None = None, *,
                    keys: Sequence[str] = (), tags: str | None = None,
                    properties: Mapping[str, str] | None = None,
                    check_immunity_ms: int | None = None,
                    trace: bool | None = None) -> Transaction:
        """Store a half message (invisible to consumers) and return its open Transaction.

        `check_immunity_ms`: no check before the half is that old (the
        txn-checker's default otherwise). `trace` as for `Producer.send`: a
        traced transaction has a `half` span and an `end` span at commit or
        rollback, and its message carries the half's trace context.
        """
        if not self._started:
            raise RuntimeError("the producer is not started: call start() or use `async with`")
        check_body(body)
        props = dict(properties or {})
        props[TXN_GROUP] = self.group
        if check_immunity_ms is not None:
            if isinstance(check_immunity_ms, bool) or not isinstance(check_immunity_ms, int) \
                    or check_immunity_ms < 0:
                raise MalformedRequestError(
                    f"check_immunity_ms must be an integer >= 0, got {check_immunity_ms!r}")
            props[CHECK_IMMUNITY_MS] = str(check_immunity_ms)
        span = (start_send(topic, len(body), hop="half")
                if wants_trace(self._producer._tracing, trace) else None)
        flags = _TXN_HALF
        if span is not None:
            props = carry(span, props)
            flags |= TRACED
        wire = make_wire(body, key, tuple(keys), tags, props, flags=flags)
        try:
            fut = await self._producer._send_wire(topic, wire, key)
            result: SendResult = await fut
        except BaseException as exc:
            if span is not None:
                end_with(span, error=exc)
            raise
        context = None
        if span is not None:
            end_with(span, result)
            context = set_span_in_context(span)
        route = self._producer._routes.cached(topic) or await self._producer._routes.route(topic)
        addr = route.broker_addr(result.broker)
        if addr is None:
            raise FerryError(f"broker {result.broker} of the half {result.msg_id} has no master")
        return Transaction(self, result, addr, context)

    @asynccontextmanager
    async def transaction(self, topic: str, body: bytes, key: str | None = None,
                          **options: Any) -> AsyncIterator[Transaction]:
        """`begin`, then commit on normal exit, rollback when the block raises.

        A transaction the block ended itself (txn.commit() / txn.rollback()) is
        left as it is. If the rollback itself fails, the block's exception is
        raised and the check-back resolves the transaction.
        """
        txn = await self.begin(topic, body, key, **options)
        try:
            yield txn
        except BaseException:
            if not txn.ended:
                try:
                    await txn.rollback()
                except FerryError as exc:
                    log.warning("rollback of %s failed (the check-back will end it): %s",
                                txn.msg_id, exc)
            raise
        if not txn.ended:
            await txn.commit()

    async def send_in_transaction(self, topic: str, body: bytes,
                                  execute: Callable[[Transaction], Any],
                                  key: str | None = None, **options: Any) -> TxnState:
        """Store a half, run `execute(txn)` (the local transaction), end it as it answers.

        `execute` (plain or coroutine function) returns a TxnState. COMMIT or
        ROLLBACK end the transaction now; UNKNOWN, an exception (logged) or
        any other value send nothing: the check-back decides. Returns the state
        the transaction was left in.
        """
        txn = await self.begin(topic, body, key, **options)
        state = await call_for_state(execute, txn, what=f"execute of {txn.msg_id}")
        if state is TxnState.COMMIT:
            await txn.commit()
        elif state is TxnState.ROLLBACK:
            await txn.rollback()
        return state

    # -- END_TRANSACTION -------------------------------------------------------------------
    async def end(self, addr: str, msg_id: str, state: TxnState) -> TxnState:
        """END_TRANSACTION by this producer; returns the state the broker reports."""
        return await self._end(addr, msg_id, state, from_check=False, by="producer")

    async def _end(self, addr: str, msg_id: str, state: TxnState, *, from_check: bool,
                   by: str) -> TxnState:
        if state is TxnState.UNKNOWN:
            raise ValueError("a transaction ends by COMMIT or ROLLBACK")
        fields = {"group": self.group, "msg_id": bytes.fromhex(msg_id), "action": state.value,
                  "from_check": from_check, "by": by}
        for attempt in range(1, END_ATTEMPTS + 1):
            try:
                resp = await self._pool.request(addr, RequestCode.END_TRANSACTION, fields)
                break
            except FerryError as exc:
                if not exc.retriable or attempt == END_ATTEMPTS:
                    raise
                log.info("END_TRANSACTION %s of %s at %s failed (%s); trying again",
                         state.value, msg_id, addr, exc)
                await asyncio.sleep(END_RETRY_BACKOFF_MS / 1000)
        return _STATES.get(str(resp.fields.get("state")), state)

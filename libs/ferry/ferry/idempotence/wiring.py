"""`consumer.run(handler, idempotence=...)`: a duplicate check around the handler, and its counts.

`idempotence` may be:

- a `RedisClaim`: the handler runs under a claim of (scene, business key);
  the scene is the claim's own (`RedisClaim(scene=...)`), else the group's name;
- a `Ledger`: the handler writes its business change and
  `ledger.record(conn, ...)` in its own transaction; a `DuplicateMessage`
  escaping it means "processed before" and the record is acknowledged;
- a `TransactionalLedger` (`ledger.transactional(connect=...)`): the check
  opens the transaction, records first and calls `handler(record, conn)`;
  scene and the rows' group default to the consumer group's name;
- any object with `wrap(handler) -> handler` (`IdempotenceCheck`).

Whatever the check, a `DuplicateMessage` escaping the handler counts as a
duplicate and is acknowledged (logged at debug), `ClaimBusyError` and
`ClaimUnavailableError` (retriable) propagate so the message is nacked and
retried later, never skipped, and every other exception propagates too.

A traced record (MessageFlag.TRACED) is checked under a `dedup` span (child
of the consumer's `process` span) whose `ferry.outcome` is ok, duplicate,
unchecked, or failed when the check or the handler raised.
"""
from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any, Protocol, runtime_checkable

from opentelemetry.context import Context
from opentelemetry.trace import get_current_span

from ferry.client.core.batch_hook import batch_hook, offer_batch_hook
from ferry.client.core.message import ConsumerRecord
from ferry.client.core.tracing import record_context
from ferry.errors import DuplicateMessage, FerryError
from ferry.idempotence.claim import RedisClaim
from ferry.idempotence.keys import biz_key_of
from ferry.idempotence.ledger import Ledger
from ferry.idempotence.states import ClaimBusyError, ClaimState, ClaimUnavailableError, Outcome
from ferry.idempotence.transactional import TransactionalLedger
from ferry.telemetry import hop_span, tracing

log = logging.getLogger("ferry.idempotence")
#: `ferry.outcome` of the `dedup` span of a traced record, by the check's outcome.
_SPAN_OUTCOMES = {Outcome.RAN: "ok", Outcome.DUPLICATE: "duplicate",
                  Outcome.UNCHECKED: "unchecked"}

Handler = Callable[[ConsumerRecord], Awaitable[Any]]
#: What `consumer.run` takes: a Handler, or `handler(record, conn)` for a TransactionalLedger.
AnyHandler = Callable[..., Awaitable[Any]]


@runtime_checkable
class IdempotenceCheck(Protocol):
    """Any check of your own: `wrap(handler)` returns the handler behind the check.

    The wrapped handler returns `Outcome.DUPLICATE` (or raises
    `DuplicateMessage`) when it skipped a duplicate, `Outcome.UNCHECKED` when
    it ran without the check; anything else it returns means it ran.
    """

    def wrap(self, handler: Handler) -> Handler: ...


@dataclass(slots=True)
class IdempotenceStats:
    """What `consumer.run(..., idempotence=...)` did: `consumer.idempotence_stats` (they only grow)."""

    ran: int = 0            # handler ran and returned (unchecked runs included)
    duplicates: int = 0     # processed before: skipped and acknowledged
    unchecked: int = 0      # ran without the check (Redis away, policy PROCESS)
    busy: int = 0           # another holder was processing it: nacked, retried later
    unavailable: int = 0    # the check's store was unreachable (policy FAIL): nacked
    failed: int = 0         # the handler (or the check) raised anything else: nacked

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class _ClaimPrefetch:
    """The runner's batch hook for a RedisClaim: a batch's claims in one call (prefetch)."""

    def __init__(self, claim: RedisClaim, scene: str) -> None:
        self.claim, self.scene = claim, scene

    async def prepare(self, records: list[ConsumerRecord]) -> None:
        await self.claim.prefetch(records, scene=self.scene)

    def forget(self, records: list[ConsumerRecord]) -> None:
        self.claim.forget(records)


def _checked(handler: AnyHandler, check: object, group: str) -> Handler:
    """`handler` behind `check` (the four kinds the module docstring lists)."""
    if isinstance(check, RedisClaim):
        scene = check.scene or group
        claimed = check.wrap(handler, scene=scene)
        offer_batch_hook(claimed, _ClaimPrefetch(check, scene))
        return claimed
    if isinstance(check, TransactionalLedger):
        return check.wrap(handler, scene=check.scene or group,
                          group=check.ledger.group or group)
    if isinstance(check, Ledger):
        return handler   # it records in its own transaction; DuplicateMessage is caught below
    if isinstance(check, IdempotenceCheck):
        return check.wrap(handler)
    raise FerryError(f"idempotence= takes a RedisClaim, a Ledger, ledger.transactional(...) or "
                     f"an object with wrap(handler); got {type(check).__name__}")


def _outcome(result: object) -> Outcome:
    if result is Outcome.DUPLICATE or result is ClaimState.DONE:
        return Outcome.DUPLICATE
    if result is Outcome.UNCHECKED or result is ClaimState.UNCHECKED:
        return Outcome.UNCHECKED
    return Outcome.RAN


def wire(handler: AnyHandler, check: object, *, group: str,
         stats: IdempotenceStats) -> Handler:
    """`handler` behind `check`, counting each outcome in `stats` (for `Consumer.run`)."""
    inner = _checked(handler, check, group)
    kind = type(check).__name__

    async def idempotent(record: ConsumerRecord) -> Outcome:
        # Off: one attribute check, and no span below. Only a stored record carries
        # trace context (a stand-in with the same attributes, e.g. in a test, does not).
        if tracing().enabled and isinstance(record, ConsumerRecord):
            ctx = record_context(record)
            if ctx is not None:
                return await _traced(record, ctx)
        return await counted(record)

    async def _traced(record: ConsumerRecord, ctx: Context) -> Outcome:
        # A child of the consumer's `process` span when it is current, else of the record's.
        parent = None if get_current_span().get_span_context().is_valid else ctx
        with hop_span("dedup", destination=record.topic, msg_id=record.msg_id, parent=parent,
                      attributes={"messaging.consumer.group.name": group,
                                  "ferry.dedup.check": kind}) as span:
            outcome = await counted(record)
            span.set_attribute("ferry.outcome", _SPAN_OUTCOMES[outcome])
            return outcome

    async def counted(record: ConsumerRecord) -> Outcome:
        try:
            outcome = _outcome(await inner(record))
        except DuplicateMessage:   # the handler's own ledger.record found it recorded
            outcome = Outcome.DUPLICATE
        except ClaimBusyError:
            stats.busy += 1
            raise
        except ClaimUnavailableError:
            stats.unavailable += 1
            raise
        except Exception:
            stats.failed += 1
            raise
        if outcome is Outcome.DUPLICATE:
            stats.duplicates += 1
            log.debug("idempotence: %s (biz_key %s) processed before; acknowledged",
                      record.msg_id, biz_key_of(record))
        else:
            stats.ran += 1
            if outcome is Outcome.UNCHECKED:
                stats.unchecked += 1
        return outcome
    offer_batch_hook(idempotent, batch_hook(inner))   # the runner shows it each batch
    return idempotent


def wire_run(handler: AnyHandler, check: object, *, group: str,
             stats: IdempotenceStats | None) -> tuple[Handler, IdempotenceStats]:
    """`consumer.run`'s wiring (`ferry.client.consuming.idempotence_hook`): `wire` with the consumer's
    stats, made at its first idempotent run."""
    stats = stats or IdempotenceStats()
    return wire(handler, check, group=group, stats=stats), stats

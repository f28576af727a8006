"""END_TRANSACTION and CHECK_TRANSACTION: ending a half message and the check-back.

END_TRANSACTION (group, msg_id, action, from_check, by) finds the
transaction's op record by the store's key index (`transactions`) and, with
no op yet, its half by its id; it then writes the `%OP%` record and, on
commit, the real message (same id, user keys, TXN_HALF cleared; it passes the
before-put hooks, so a TTL message's queue is noted), real message first.
The write goes to the group commit (`txn_batch`): the ENDs of one event-loop
turn share one store write through the put pipeline and one durability wait.
Everything from the state check to joining the batch is synchronous, and an
END whose op record waits in the batch is found there (`pending`): two ENDs
of one transaction on this broker cannot both find "no op" and both write.
Ending again the same way writes nothing and answers the same state (once that
op record is durable, on a sync-flush broker); the other way is
TransactionStateError; an unknown id is MessageNotFoundError. A TRACED half's
END gets an `end` span (SERVER, `ferry.outcome` commit / rollback)
around its write; the committed message keeps the half's trace context and flag.

CHECK_TRANSACTION (group, msg_id), from the txn-checker: a transaction that
already has an op record is answered `forwarded` false with its `state`, so
the checker never asks a producer about a finished transaction; otherwise the
broker pushes a one-way CHECK_TRANSACTION (group, msg_id, topic, body = the
half record as stored) to a live producer connection of the group, in
round-robin order, and answers `forwarded` true (false when none is live).

With auth on, a transaction belongs to those who may publish to its topic
(issue 24): an END needs `pub` on the half's real topic (or admin `txn`, the
txn-checker), checked against the record in the store before anything is
written, and a check-back is pushed only to a producer whose heartbeat's
identity holds `pub` on that topic; a group member without it gets none.
"""
from __future__ import annotations

import itertools
from contextlib import AbstractContextManager

from ferry.codec import (
    REAL_QUEUE_ID,
    REAL_TOPIC,
    TXN_GROUP,
    MessageFlag,
    StoredMessage,
    msg_id_hex,
)
from ferry.codec.txn_op import ACTIONS, BY_VALUES, COMMIT
from ferry.errors import (
    FlushTimeoutError,
    MalformedRequestError,
    MessageNotFoundError,
    StoreError,
    TransactionStateError,
)
from ferry.names import HALF_TOPIC, OP_TOPIC
from ferry.store import MessageIn, MessageStore
from ferry.telemetry import extract, hop_span, tracing
from ferry.wire import Frame, RequestCode, request, response
from opentelemetry.trace import Span, SpanKind

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import group_field, str_field
from ferry_broker.handlers.query import parse_msg_id
from ferry_broker.put_pipeline import PutBatch
from ferry_broker.transactions import (
    STATES,
    committed_message,
    find_half,
    find_op,
    op_action,
    op_message,
)
from ferry_broker.txn_batch import PendingEnd

OPEN_STATE = "open"
_MAX_REQUEST_ID = 0xFFFFFFFF
_push_ids = itertools.count(1)
_TRACED = int(MessageFlag.TRACED)


def _end_span(ctx: BrokerContext, half: StoredMessage, written: str,
              by: str) -> AbstractContextManager[Span]:
    """The broker's `end` span (SERVER) of a traced transaction, child of its half's context."""
    return hop_span("end", destination=half.properties.get(REAL_TOPIC, ""), kind=SpanKind.SERVER,
                    msg_id=msg_id_hex(half.msg_id), parent=extract(half.properties),
                    attributes={"ferry.broker": ctx.config.name, "ferry.txn_by": by,
                                "ferry.txn_action": written, "ferry.outcome": written})


def _action(fields: dict[str, object]) -> str:
    action = str_field(fields, "action", 16)
    if action not in ACTIONS:
        raise MalformedRequestError(f"field 'action' must be one of {', '.join(ACTIONS)}, "
                                    f"not {action!r}")
    return action


def _by(fields: dict[str, object]) -> str:
    from_check = fields.get("from_check")
    if from_check is not None and type(from_check) is not bool:
        raise MalformedRequestError(f"field 'from_check' must be a bool, not {from_check!r}")
    by = str_field(fields, "by", 16, "check" if from_check else "producer")
    if by not in BY_VALUES:
        raise MalformedRequestError(f"field 'by' must be one of {', '.join(BY_VALUES)} or nil, "
                                    f"not {by!r}")
    return by


def _check_group(record: StoredMessage, msg_id: bytes, group: str) -> None:
    """Refuse a request naming another group than the one that began the transaction."""
    owner = record.properties.get(TXN_GROUP, "")
    if owner and owner != group:
        raise MalformedRequestError(f"transaction {msg_id_hex(msg_id)} belongs to producer "
                                    f"group {owner}, not {group}")


def _half_of(store: MessageStore, msg_id: bytes, group: str) -> StoredMessage:
    half = find_half(store, msg_id)
    if half is None:
        raise MessageNotFoundError(f"no transaction {msg_id_hex(msg_id)} on this broker")
    _check_group(half, msg_id, group)
    return half


def _half_and_committed(store: MessageStore, msg_id: bytes,
                        group: str) -> tuple[StoredMessage, StoredMessage | None]:
    """The transaction's half, and its committed message if already in its topic.

    The real message goes before the op record in the commit's one write: a
    crash that tore the write between the two leaves the message without its op,
    and the next commit then writes the op alone instead of a second copy.
    One id lookup answers both in the usual case: the newest record with the id
    (`query_by_id`) is the half itself when nothing was committed after it.
    Otherwise the half is looked up by its transaction key.
    """
    newest = store.query_by_id(msg_id)
    if newest is not None and newest.topic == HALF_TOPIC:
        _check_group(newest, msg_id, group)
        return newest, None
    half = _half_of(store, msg_id, group)
    props = half.properties
    if (newest is not None and newest.topic == props.get(REAL_TOPIC)
            and str(newest.queue_id) == props.get(REAL_QUEUE_ID)):
        return half, newest
    return half, None


async def _durable(ctx: BrokerContext, end_offset: int) -> None:
    """On a sync-flush broker, wait until the store is fsynced up to `end_offset`."""
    if ctx.config.flush_mode != "sync":
        return
    try:
        await ctx.durability.wait(ctx.store.wait_durable(end_offset))
    except FlushTimeoutError:
        raise FlushTimeoutError(
            f"stored but not flushed within {ctx.config.flush_timeout_ms} ms") from None
    except StoreError as exc:
        raise ctx.health.unavailable(exc) from None


def _check_topic_right(ctx: BrokerContext, req: Frame, record: StoredMessage) -> None:
    """With auth on: refuse an END from an identity without `pub` on the transaction's topic."""
    if ctx.auth is not None:
        ctx.auth.require_topic_right(req, record.properties.get(REAL_TOPIC, ""), "txn")


async def _repeated(ctx: BrokerContext, req: Frame, op: StoredMessage, msg_id: bytes,
                    action: str, group: str) -> Frame:
    """The answer to an END of a transaction that an op record already ended."""
    _check_group(op, msg_id, group)
    _check_topic_right(ctx, req, op)
    done = op_action(op)
    if done != action:
        raise _refuse(msg_id, done, action)
    ctx.txn_stats.repeated_ends += 1
    queue_offset = -1
    if done == COMMIT:
        newest = ctx.store.query_by_id(msg_id)
        if newest is not None and newest.topic == op.properties.get(REAL_TOPIC):
            queue_offset = newest.queue_offset
    await _durable(ctx, op.end_offset)
    return response(req, {"state": STATES[done], "queue_offset": queue_offset,
                          "repeated": True})


def _refuse(msg_id: bytes, done: str, action: str) -> TransactionStateError:
    return TransactionStateError(f"transaction {msg_id_hex(msg_id)} was already "
                                 f"{STATES[done].replace('_', ' ')}; it cannot {action}")


async def _repeated_pending(ctx: BrokerContext, req: Frame, pend: PendingEnd, msg_id: bytes,
                            action: str, group: str) -> Frame:
    """The answer to an END of a transaction whose op record is in the open batch."""
    if pend.group and pend.group != group:
        raise MalformedRequestError(f"transaction {msg_id_hex(msg_id)} belongs to producer "
                                    f"group {pend.group}, not {group}")
    if ctx.auth is not None:
        ctx.auth.require_topic_right(req, pend.topic, "txn")
    if pend.written != action:
        raise _refuse(msg_id, pend.written, action)
    ctx.txn_stats.repeated_ends += 1
    results = await ctx.txn_ends.join(pend)  # answered once written (and durable)
    queue_offset = pend.queue_offset
    if pend.real_index >= 0:
        queue_offset = results[pend.real_index].queue_offset
    return response(req, {"state": STATES[pend.written], "queue_offset": queue_offset,
                          "repeated": True})


async def handle_end_transaction(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    ctx.roles.require_master()  # a slave takes no write (and creates no topic)
    f = req.fields
    group = group_field(f)
    msg_id = parse_msg_id(f.get("msg_id"))
    action = _action(f)
    by = _by(f)
    # From here to adding the write to the batch nothing awaits: see the module docstring.
    store, ends = ctx.store, ctx.txn_ends
    pend = ends.pending.get(msg_id)
    if pend is not None:
        return await _repeated_pending(ctx, req, pend, msg_id, action, group)
    op = find_op(store, msg_id)
    if op is not None:
        return await _repeated(ctx, req, op, msg_id, action, group)
    half, existing = _half_and_committed(store, msg_id, group)
    _check_topic_right(ctx, req, half)
    ctx.topics.queues_for_send(OP_TOPIC)  # registers %OP% so that namesrv routes it
    msgs: list[MessageIn] = []
    queue_offset = -1
    if existing is not None:
        # A torn commit: the message is out already, so the op record must say commit.
        queue_offset = existing.queue_offset
        written = COMMIT
    else:
        written = action
        if action == COMMIT:
            real = committed_message(half)
            batch = PutBatch(real.topic, real.queue_id, [real])
            ctx.pipeline.prepare(batch)
            msgs.extend(batch.messages)
    msgs.append(op_message(half, written, by, conn.peer))
    pend, done = ends.add(msg_id, msgs, written=written, queue_offset=queue_offset,
                          group=half.properties.get(TXN_GROUP, ""),
                          topic=half.properties.get(REAL_TOPIC, ""))
    if half.flags & _TRACED and tracing().enabled:
        with _end_span(ctx, half, written, by):
            results = await done
    else:
        results = await done
    state = STATES[written]
    ctx.txn_stats.ended[state] += 1
    if written != action:
        raise TransactionStateError(f"transaction {msg_id_hex(msg_id)} was already committed "
                                    f"(its message is in {half.properties.get(REAL_TOPIC)}); "
                                    f"it cannot {action}")
    if pend.real_index >= 0:
        queue_offset = results[pend.real_index].queue_offset
    return response(req, {"state": state, "queue_offset": queue_offset, "repeated": False})


async def handle_check_transaction(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    group = group_field(f)
    msg_id = parse_msg_id(f.get("msg_id"))
    store, stats = ctx.store, ctx.txn_stats
    op = find_op(store, msg_id)
    if op is not None:
        stats.checks["ended"] += 1
        return response(req, {"forwarded": False, "state": STATES[op_action(op)]})
    half = _half_of(store, msg_id, group)
    raw = store.read_raw(half.phy_offset)
    if raw is None:  # retention took it between the lookup and now
        raise MessageNotFoundError(f"no transaction {msg_id_hex(msg_id)} on this broker")
    topic = half.properties.get(REAL_TOPIC, "")
    fields = {"group": group, "msg_id": half.msg_id, "topic": topic}
    auth = ctx.auth
    for producer in ctx.producers.pick(group):
        if auth is not None and not auth.may_publish(producer.access_key, topic):
            continue  # a member of the group that may not publish there learns nothing of it
        push_id = next(_push_ids) & _MAX_REQUEST_ID
        if producer.push(request(RequestCode.CHECK_TRANSACTION, push_id, fields, raw,
                                 oneway=True)):
            stats.checks["forwarded"] += 1
            return response(req, {"forwarded": True, "state": OPEN_STATE,
                                   "client_id": producer.client_id})
    stats.checks["no_producer"] += 1
    return response(req, {"forwarded": False, "state": OPEN_STATE})

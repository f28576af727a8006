"""Offsets: consumer commits and queries, a queue's bounds, and the offset for a time."""
from __future__ import annotations

import asyncio

from ferry.auth.signing import parse_wire_auth
from ferry.errors import BusyError, TopicNotFoundError
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import (
    flag_field,
    hist_field,
    offset_field,
    position_fields,
    queue_field,
    topic_field,
)


async def handle_commit_offset(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    """COMMIT_OFFSET: remember the next offset a group will read from a queue.

    Only for a queue that exists on this broker (issue 24: names chosen by a client
    must not fill the table): its topic configured here with more queues than
    `queue_id`, or the queue in the store. An offset past the queue's end is lowered
    (`_lowered`: a re-delivery, never a skip). A new entry beyond the table's bounds
    is refused (consumer_offsets).

    With `reset: true` (an operator's reset, which needs `reset` on the group): refused
    with BusyError while the group has live members on this broker, unless `force`;
    the answer has the offset before (`from`, -1 for none) and after (`to`), and the
    members' next PULL is told to move there (offset_resets.py). Until they do, their
    own commits of that queue are ignored (the answer then says `reset_pending`). The
    mark and the new offset are on disk before the answer: a restarted broker still
    tells the members."""
    f = req.fields
    group, topic, queue_id = position_fields(f)
    offset, hist = offset_field(f), hist_field(f)
    reset, force = flag_field(f, "reset"), flag_field(f, "force")
    top = ctx.store.max_offset(topic, queue_id)
    if top == 0 and queue_id >= ctx.topics.queue_count(topic):
        raise TopicNotFoundError(f"no queue {queue_id} of topic {topic} on broker "
                                 f"{ctx.config.name}: nothing to commit an offset for")
    if offset > top:
        offset, hist = _lowered(ctx, topic, queue_id, offset, hist, top)
    key = (group, topic, queue_id)
    if not reset and (pending := ctx.resets.get(key)) is not None:
        return response(req, {"reset_pending": pending})
    before = ctx.offsets.query(group, topic, queue_id)
    if reset:
        members = ctx.consumers.members(group)
        if members and not force:
            raise BusyError(f"group {group} has {len(members)} live member(s) on broker "
                            f"{ctx.config.name}: stop them first, or force the reset (they "
                            "are told to move to the new offsets)")
        hist = None   # an operator's position names no history (like a user's seek)
    identity = parse_wire_auth(req.auth).access_key if ctx.auth is not None else None
    ctx.offsets.commit(group, topic, queue_id, offset, hist, identity)
    if not reset:
        return response(req)
    ctx.resets.mark(key, offset)
    # Durable before it is answered (a restart takes the mark back, offset_resets.py): the
    # mark first, then the offset it names; a crash between the two loses the unanswered
    # reset whole (at start a mark is taken back only where the committed offset is its).
    await asyncio.to_thread(ctx.resets.write_snapshot, *ctx.resets.snapshot())
    await asyncio.to_thread(ctx.offsets.write_snapshot, *ctx.offsets.snapshot())
    ctx.long_poll.notify(topic, queue_id)   # a member's parked PULL is answered now
    return response(req, {"from": before, "to": offset})


def _lowered(ctx: BrokerContext, topic: str, queue_id: int, offset: int, hist: str | None,
             top: int) -> tuple[int, str | None]:
    """Where a commit past the queue's end (`top`) goes, and its history.

    To the end, without a history (as the table does after a failover: the reader
    read a master ahead of this log), unless its history is one this log does not
    continue (issue 16: the broker lost it with its disk, or a newer term replaced
    it): then to where they part. A live member's auto-commit of its position in the
    lost history reaches a restarted broker before its next PULL is sent back; at
    the end, the member that loads it next (a rebalance) would skip every record
    the new log holds below it."""
    if hist is not None:
        history = ctx.store.queue_history(topic, queue_id)
        back = history.divergence(hist, offset, ctx.store.min_offset(topic, queue_id), top)
        if back is not None and back < top:
            return back, (history.id_at(back - 1) if back > 0 else None)
    return top, None


async def handle_query_offset(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    """QUERY_OFFSET: the committed offset, -1 when the group never committed there; `hist`
    when committed with one (the consumer's first PULL carries it, issue 16); with -1,
    `since_ms`: when this broker's table began (its store started on an empty directory;
    0 unknown), so that a group older than that knows its offset here was lost."""
    f = req.fields
    group, topic, queue_id = position_fields(f)
    fields: dict[str, object] = {"offset": ctx.offsets.query(group, topic, queue_id)}
    if (hist := ctx.offsets.query_hist(group, topic, queue_id)) is not None:
        fields["hist"] = hist
    if fields["offset"] == -1:   # since when this table exists (the store started empty)
        fields["since_ms"] = ctx.store.histories.created_ms
    return response(req, fields)


async def handle_get_min_max(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    """GET_MIN_MAX: the oldest stored queue offset and the next one to be written."""
    topic, queue_id = topic_field(req.fields), queue_field(req.fields)
    return response(req, {"min_offset": ctx.store.min_offset(topic, queue_id),
                          "max_offset": ctx.store.max_offset(topic, queue_id)})


async def handle_offset_for_time(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    """OFFSET_FOR_TIME: the first queue offset stored at or after `ts_ms`."""
    f = req.fields
    topic, queue_id = topic_field(f), queue_field(f)
    ts_ms = offset_field(f, "ts_ms")
    return response(req, {"offset": ctx.store.offset_for_timestamp(topic, queue_id, ts_ms)})

"""PULL: read stored records of one queue from an offset, long polling when there are none.

The response body is the stored records back to back, exactly as on disk
(no re-encoding); the client decodes them with `ferry.store.iter_records`.
`status` is the store's GetStatus name; `next_offset` is where the next pull
starts, also after OFFSET_TOO_SMALL / OFFSET_OVERFLOW_* so that the consumer
can correct its position. When the queue has nothing new (or nothing that
matches the tags), the pull is parked for up to `max_wait_ms` (capped by the
broker) and answered as soon as a matching message is stored.

Filtering (`filters.py`): `tags` and `sql` become a compiled filter, cached;
the store skips consume-queue entries whose tag hash is not wanted, then
records failing the exact check (tag string, SQL92). Skipped records are
passed for good: `next_offset` moves past them in every answer, the long
poll's included, so that a consumer's position (and lag) moves too. Records
of queues that have held TTL messages are checked for expiry (see
`hooks/ttl.py`): an expired one is left out, as if filtered.

`unchecked: true` (a reader that checks every record itself, as Kafka's
consumers do with check.crcs): a plain read (no filter, no TTL) is served
without the store's record check.

Slaves serve PULL too (issue 9). A master whose answer lies more than
`slave_read_lag_bytes` behind its commit-log end, while a slave is live,
adds `suggest_slave: true` (the consumer reads from a slave next time). A
sync master serves only records below its confirmed offset (what every
in-sync slave acknowledged; `RoleManager.confirmed_offset`), as if its
queues ended there: a record a consumer saw survives any failover.

Histories (issue 16, `ferry.store.histories`): `hist` names the history of the
record before `offset` that the consumer last received. When the broker's log
is not the continuation of that history, the answer is HISTORY_DIVERGED with
`next_offset` where they part, and no records: the consumer goes back there.
The check runs again after a long poll (the log may have been truncated and
rewritten meanwhile). A PULL with `hist` past the end of a history this replica
continues is "not caught up": it waits there, it is not moved. An answer never
spans two histories, and says (`hist`) which history the record at
`next_offset - 1` belongs to. A PULL without `hist` past the queue's end
(OFFSET_OVERFLOW_BADLY) is sent to the queue's oldest stored record, never to
its end: nothing says how many histories began since it read.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from ferry.codec.record import AT_PHY_OFFSET, AT_QUEUE_OFFSET, I64
from ferry.store import GetResult, GetStatus
from ferry.store.histories import QueueHistory
from ferry.wire import Frame, response
from ferry.wire.pull import MAX_PULL_BYTES, MAX_PULL_COUNT, PullStatus

from ferry_broker.cold_reads import warm_for_read
from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.handlers.fields import (
    flag_field,
    hist_field,
    int_field,
    offset_field,
    position_fields,
)

DEFAULT_MAX_COUNT = 32
DEFAULT_MAX_BYTES = 1 << 20
# How long one filtered pull may scan (on the event loop, under the store lock): a
# selector can cost hundreds of microseconds a record, and 16,000 of them would
# stall every other client for seconds. The scan stops there; the answer's
# next_offset says how far it got, and the consumer pulls again at once.
MAX_FILTER_SCAN_MS = 20
# How often a pull parked on a sync master looks for newly confirmed records anyway.
CONFIRMED_RECHECK_S = 0.2
# Statuses after which a pull waits for new messages instead of answering at once.
_WAIT_STATUSES = frozenset({GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.OFFSET_OVERFLOW_ONE,
                            GetStatus.NO_MATCHED_MESSAGE})
#: The answer to a PULL whose `hist` the broker's log does not continue (issue 16).
HISTORY_DIVERGED = PullStatus.HISTORY_DIVERGED.value


async def handle_pull(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    group, topic, queue_id = position_fields(f)
    offset = offset_field(f)
    max_count = int_field(f, "max_count", 1, MAX_PULL_COUNT, DEFAULT_MAX_COUNT)
    max_bytes = int_field(f, "max_bytes", 1, MAX_PULL_BYTES, DEFAULT_MAX_BYTES)
    max_wait_ms = min(int_field(f, "max_wait_ms", 0, 2**31, 0), ctx.config.max_pull_wait_ms)
    hist = hist_field(f)
    compiled = ctx.filters.get(f.get("tags"), f.get("sql"))
    tag_hashes, match = compiled.tag_hashes, compiled.match
    if match is not None:
        ctx.filters.pulled(f.get("tags"), f.get("sql"))
    ctx.topics.check_readable(topic)

    expiry = ctx.expiry
    ttl_queue = (topic, queue_id) in expiry.queues if expiry.queues else False
    # `unchecked`: the reader checks every record itself (Spark's source does), so the
    # store skips its CRC check of a plain read; a reader that meets a corrupt record
    # pulls again without it, and the store skips and logs that record as always.
    # Filtered and TTL reads look into records here: they stay checked.
    check = not (flag_field(f, "unchecked") and match is None and tag_hashes is None
                 and not ttl_queue)

    history = ctx.store.queue_history(topic, queue_id)
    looks = 0

    def get(at: int) -> GetResult:
        nonlocal history, looks
        if looks:   # a look after a wait: a new term may have begun meanwhile
            history = ctx.store.queue_history(topic, queue_id)
        looks += 1
        got = ctx.store.get_messages(topic, queue_id, at, max_count, max_bytes, tag_hashes,
                                     match, MAX_FILTER_SCAN_MS, history.end_of_history_at(at),
                                     check)
        if ttl_queue and got.records:
            live = expiry.live(topic, got.records)
            if len(live) != len(got.records):
                status = GetStatus.FOUND if live else GetStatus.NO_MATCHED_MESSAGE
                got = GetResult(status, live, got.next_queue_offset, got.min_offset,
                                got.max_offset)
        if got.records and (limit := ctx.roles.confirmed_offset()) is not None:
            got = _confirmed_only(got, limit)
        elif hist is not None and got.status is GetStatus.OFFSET_OVERFLOW_BADLY:
            # Past the end of a history this replica continues (checked below): it has not
            # caught up with the reader yet; the pull waits there, it is not moved back.
            got = GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], at, got.min_offset,
                            got.max_offset)
        return got

    # Records out of the page cache are read in on a thread first (cold_reads.py): a
    # page fault here would stall the whole event loop on the disk. Not for a filtered
    # pull: it reads many entries per record it delivers, past what the probe covers,
    # and the probe cost it a quarter of its rate (filter.tag; docs/perf/backlog.md).
    if tag_hashes is None and match is None:
        await warm_for_read(ctx.store, topic, queue_id, offset, max_count, max_bytes)
    where = (group, topic, queue_id)
    if (reset_to := ctx.resets.redirect(where, offset)) is not None:
        return _reset_answer(ctx, req, reset_to)
    got = get(offset)
    if (answer := _history_answer(ctx, req, where, hist, offset, got, history)) is not None:
        return answer
    if _caught_up(got) and max_wait_ms > 0 and not ctx.long_poll.closing:
        got = await _long_poll(ctx, conn, topic, queue_id, offset, got, max_wait_ms, get,
                               lambda: ctx.resets.get(where) is not None)
        # An operator may have reset the group's offset while the pull was parked.
        if (reset_to := ctx.resets.redirect(where, offset)) is not None:
            return _reset_answer(ctx, req, reset_to)
        # The log may have been truncated and rewritten while the pull was parked (a
        # demoted master rejoining): the reloaded history is checked again.
        if (answer := _history_answer(ctx, req, where, hist, offset, got, history)) is not None:
            return answer
    fields = _fields(got.status.name, got.next_queue_offset, got, history)
    if not got.records:
        return response(req, fields)
    ctx.delivery.record(group, topic, got.records)
    if ctx.roles.server is not None and _far_behind(ctx, got.records[-1]):
        fields["suggest_slave"] = True
    # One copy out of the commit log's mmap: a view handed to the transport could
    # outlive the mapping (retention unmaps old segments).
    return response(req, fields, b"".join(got.records))


def _reset_answer(ctx: BrokerContext, req: Frame, reset_to: int) -> Frame:
    """OFFSET_RESET: an operator moved the group's offset of this queue to `reset_to`
    (offset_resets.py); no records, no history (the reader drops what it buffered)."""
    f = req.fields
    topic, queue_id = f["topic"], f["queue_id"]
    return response(req, {"status": PullStatus.OFFSET_RESET.value, "next_offset": reset_to,
                          "min_offset": ctx.store.min_offset(topic, queue_id),
                          "max_offset": ctx.store.max_offset(topic, queue_id)})


def _history_answer(ctx: BrokerContext, req: Frame, where: tuple[str, str, int],
                    hist: str | None, offset: int, got: GetResult,
                    history: QueueHistory) -> Frame | None:
    """The answer that moves the reader back (a diverged history, or an overflow without
    one), or None when `got` can be answered as it is."""
    if hist is not None:
        return _diverged(ctx, req, where, hist, offset, got, history)
    if got.status is GetStatus.OFFSET_OVERFLOW_BADLY:
        return _overflow(ctx, req, where, offset, got, history)
    return None


def _diverged(ctx: BrokerContext, req: Frame, where: tuple[str, str, int], hist: str,
              offset: int, got: GetResult, history: QueueHistory) -> Frame | None:
    """The HISTORY_DIVERGED answer when this log does not continue `hist` at `offset`."""
    back = history.divergence(hist, offset, got.min_offset, got.max_offset)
    if back is None or back >= offset:
        return None
    ctx.histories.event("diverged", *where, offset, back,
                        f"the queue's history {hist} ends at {back} on this broker"
                        if hist in history.ids else f"history {hist} is unknown here")
    return response(req, _fields(HISTORY_DIVERGED, back, got, history))


def _overflow(ctx: BrokerContext, req: Frame, where: tuple[str, str, int], offset: int,
              got: GetResult, history: QueueHistory) -> Frame:
    """The answer to a PULL without `hist` past the queue's end: nothing says how many
    histories began since the reader read, so back to the oldest stored record
    (duplicates, never a gap)."""
    start = got.min_offset
    ctx.histories.event("overflow_rewound", *where, offset, start,
                        "offset past the queue's end and no history given")
    return response(req, _fields(got.status.name, start, got, history))


def _fields(status: str, next_offset: int, got: GetResult,
            history: QueueHistory) -> dict[str, object]:
    """The answer's fields; `hist` is the history of the record at next_offset - 1."""
    fields: dict[str, object] = {"status": status, "next_offset": next_offset,
                                 "min_offset": got.min_offset, "max_offset": got.max_offset}
    if next_offset > 0 and (hist := history.id_at(next_offset - 1)) is not None:
        fields["hist"] = hist
    return fields


def _far_behind(ctx: BrokerContext, last: memoryview) -> bool:
    """A master's read of old data that a live slave could serve instead (issue 9).

    Measured as RocketMQ does: how far the served records lie behind the
    commit-log end, against `slave_read_lag_bytes` (old data is likely out of
    the page cache; reading it from a slave spares the master's disk)."""
    phy_offset = I64.unpack_from(last, AT_PHY_OFFSET)[0]
    behind = ctx.store.commit_log_max_offset - phy_offset
    return behind > ctx.config.slave_read_lag_bytes and ctx.roles.has_live_slave()


def _confirmed_only(got: GetResult, limit: int) -> GetResult:
    """`got` without the records at or past commit-log offset `limit` (a sync master's
    records no in-sync slave has yet): the queue looks as if it ended there."""
    records = got.records
    if I64.unpack_from(records[-1], AT_PHY_OFFSET)[0] < limit:
        return got
    keep = [r for r in records if I64.unpack_from(r, AT_PHY_OFFSET)[0] < limit]
    end = I64.unpack_from(records[len(keep)], AT_QUEUE_OFFSET)[0]
    if keep:
        return GetResult(GetStatus.FOUND, keep, end, got.min_offset, got.max_offset)
    return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, [], end, got.min_offset, end)


def _caught_up(got: GetResult) -> bool:
    """Nothing to serve and nothing left to scan: the pull may wait for new messages.

    A NO_MATCHED_MESSAGE that stopped at the store's scan bound (entries remain
    past `next_offset`) is answered at once instead: the consumer moves there
    and pulls again, rather than waiting while unscanned messages sit there.
    """
    if got.status is GetStatus.NO_MATCHED_MESSAGE:
        return got.next_queue_offset >= got.max_offset
    return got.status in _WAIT_STATUSES


async def _long_poll(ctx: BrokerContext, conn: ConnInfo, topic: str, queue_id: int,
                     offset: int, got: GetResult, max_wait_ms: int,
                     get: Callable[[int], GetResult], moved: Callable[[], bool]) -> GetResult:
    """Park until a matching message arrives, the wait runs out or `moved()` (an
    operator reset the position); the last result."""
    deadline = time.monotonic() + max_wait_ms / 1000.0
    # A sync master also looks again now and then: records become visible when a slave
    # confirms them, and a write whose wait failed (or a smaller in-sync set) wakes nobody.
    recheck_s = CONFIRMED_RECHECK_S if ctx.roles.confirmed_offset() is not None else None
    with ctx.long_poll.slot(conn.conn_id):
        while _caught_up(got):
            remaining = deadline - time.monotonic()
            if remaining <= 0 or ctx.long_poll.closing:
                break
            # Messages that did not match are skipped for good: the next look starts
            # after them (and so does the answer's next_offset).
            offset = max(offset, got.next_queue_offset)
            woke = await ctx.long_poll.wait(
                topic, queue_id, remaining if recheck_s is None else min(remaining, recheck_s))
            if moved():
                break
            got = get(offset)
            if not woke and recheck_s is None:
                break
    return got

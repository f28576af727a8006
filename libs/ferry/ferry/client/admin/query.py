"""Message queries for operators: by message id, by key, by store time (read-only).

What `Admin.query_message`, `Admin.query_by_key` and `Admin.messages_by_time`
run (and `ferry message get | key | time`, and the console's message search):

- by id: QUERY_BY_ID on one member of every broker group namesrv lists (the
  master, else a slave: they hold the same records), so a message is found in
  whatever topic it was stored, internal ones included. A message keeps its id
  through `%SCHEDULE%`, `%RETRY%<group>`, `%DLQ%<group>`; each broker answers
  the newest record it stores under the id, so the answer is one record per
  broker that holds the message (oldest first);
- by key: QUERY_BY_KEY on every broker group of the topic's route, newest first;
- by time: OFFSET_FOR_TIME of the window's ends on every readable queue, then
  PULLs (no long polling, no filter) of what lies between, under a group of
  its own that never commits, so no consumer's position moves.

Every answer is a list of `ConsumerRecord`s, each naming the broker that
stored it. A broker that cannot be asked is skipped (`QueryResult.errors`
names it) so that one dead broker does not hide what the others hold.
"""
from __future__ import annotations

import logging

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.message import ConsumerRecord, TopicQueue
from ferry.client.core.namesrv import NamesrvClient, RouteCache
from ferry.client.core.offsets import read_addr
from ferry.client.reading.ranges import read_range
from ferry.codec.record import iter_records
from ferry.errors import FerryError, MalformedRequestError, MessageNotFoundError
from ferry.names import validate_topic
from ferry.wire import RequestCode

log = logging.getLogger(__name__)

#: The group named in the PULLs of a time query (it never commits).
READ_GROUP = "ferry-admin-query"
#: A broker answers QUERY_BY_KEY with at most this many records.
MAX_KEY_COUNT = 64
#: A time query returns at most this many records (the console pages through less).
MAX_TIME_COUNT = 1024
#: Records asked for per PULL of a time query.
PULL_BATCH = 256
MSG_ID_CHARS = 32
MAX_KEY_CHARS = 1024


class QueryResult(list[ConsumerRecord]):
    """The records found (a list), with the brokers or queues that could not be asked
    (`errors`) and whether `max_count` cut the answer short (`truncated`)."""

    def __init__(self) -> None:
        super().__init__()
        self.errors: list[str] = []
        self.truncated = False


def check_msg_id(msg_id: str) -> str:
    """The id in upper case; MalformedRequestError unless it is 32 hex characters."""
    try:
        ok = len(msg_id) == MSG_ID_CHARS and bytes.fromhex(msg_id) is not None
    except ValueError:
        ok = False
    if not ok:
        raise MalformedRequestError(f"a message id is {MSG_ID_CHARS} hex characters, "
                                    f"not {msg_id!r}")
    return msg_id.upper()


def check_key(key: str) -> str:
    if not key or " " in key or len(key) > MAX_KEY_CHARS:
        raise MalformedRequestError(f"a key is 1..{MAX_KEY_CHARS} characters without spaces, "
                                    f"not {key!r}")
    return key


def decode_query_body(body: bytes | bytearray | memoryview, broker: str) -> list[ConsumerRecord]:
    """The records of a QUERY_BY_ID / QUERY_BY_KEY answer (each names its own topic)."""
    return [ConsumerRecord.from_stored(stored, broker) for stored in iter_records(body)]


async def broker_members(namesrv: NamesrvClient) -> dict[str, str]:
    """Broker group name -> the wire address to ask: its master (newest epoch), else a slave."""
    listed = await namesrv.call("GET", "/v1/brokers")
    best: dict[str, tuple[int, int, str]] = {}
    for b in listed.get("brokers", []):
        if not isinstance(b, dict) or not b.get("addr"):
            continue
        rank = (1 if b.get("role", "master") in ("master", "") else 0, int(b.get("epoch", 0)))
        name = str(b["name"])
        if name not in best or rank > best[name][:2]:
            best[name] = (*rank, str(b["addr"]))
    return {name: addr for name, (_, _, addr) in sorted(best.items())}


async def query_by_id(pool: ConnectionPool, namesrv: NamesrvClient, msg_id: str) -> QueryResult:
    """The newest record of message `msg_id` on each broker group that has it, oldest first."""
    msg_id = check_msg_id(msg_id)
    out = QueryResult()
    for broker, addr in (await broker_members(namesrv)).items():
        try:
            resp = await pool.request(addr, RequestCode.QUERY_BY_ID, {"msg_id": msg_id})
        except MessageNotFoundError:
            continue
        except FerryError as exc:
            log.info("QUERY_BY_ID at %s failed: %s", broker, exc)
            out.errors.append(f"{broker}: {type(exc).__name__}: {exc}")
            continue
        out.extend(decode_query_body(resp.body, broker))
    out.sort(key=lambda r: (r.store_ts_ms, r.broker))
    return out


async def query_by_key(pool: ConnectionPool, routes: RouteCache, topic: str, key: str, *,
                       begin_ms: int = 0, end_ms: int | None = None,
                       max_count: int = MAX_KEY_COUNT) -> QueryResult:
    """Messages of `topic` stored with `key` in [begin_ms, end_ms], newest first."""
    validate_topic(topic, allow_internal=True)
    check_key(key)
    if not 1 <= max_count <= MAX_KEY_COUNT:
        raise MalformedRequestError(f"max_count must be 1..{MAX_KEY_COUNT}, not {max_count}")
    fields: dict[str, object] = {"topic": topic, "key": key, "begin_ms": max(0, begin_ms),
                                 "max_count": max_count}
    if end_ms is not None:
        fields["end_ms"] = max(0, end_ms)
    route = await routes.route(topic)
    out = QueryResult()
    for group in route.brokers:
        addr = group.master or (group.slaves[0] if group.slaves else None)
        if addr is None:
            out.errors.append(f"{group.name}: no live member")
            continue
        try:
            resp = await pool.request(addr, RequestCode.QUERY_BY_KEY, fields)
        except FerryError as exc:
            log.info("QUERY_BY_KEY at %s failed: %s", group.name, exc)
            out.errors.append(f"{group.name}: {type(exc).__name__}: {exc}")
            continue
        out.extend(decode_query_body(resp.body, group.name))
    out.sort(key=lambda r: (-r.store_ts_ms, r.broker))
    out.truncated = len(out) > max_count
    del out[max_count:]
    return out


async def by_time(pool: ConnectionPool, routes: RouteCache, topic: str, begin_ms: int,
                  end_ms: int, *, max_count: int = MAX_TIME_COUNT) -> QueryResult:
    """Messages of `topic` stored in [begin_ms, end_ms), oldest first, at most `max_count`."""
    validate_topic(topic, allow_internal=True)
    if not 1 <= max_count <= MAX_TIME_COUNT:
        raise MalformedRequestError(f"max_count must be 1..{MAX_TIME_COUNT}, not {max_count}")
    if end_ms < begin_ms:
        raise MalformedRequestError(f"the window ends ({end_ms}) before it begins ({begin_ms})")
    route = await routes.route(topic)
    out = QueryResult()
    for broker, queue_id in route.readable_queues():
        tq = TopicQueue(topic, broker, queue_id)
        try:
            await _read_window(pool, routes, tq, begin_ms, end_ms, max_count, out)
        except FerryError as exc:
            log.info("time query of %s failed: %s", tq, exc)
            out.errors.append(f"{tq}: {type(exc).__name__}: {exc}")
    out.sort(key=lambda r: (r.store_ts_ms, r.broker, r.queue_id, r.queue_offset))
    out.truncated = out.truncated or len(out) > max_count
    del out[max_count:]
    return out


async def _read_window(pool: ConnectionPool, routes: RouteCache, tq: TopicQueue, begin_ms: int,
                       end_ms: int, max_count: int, out: QueryResult) -> None:
    """Append the records of `tq` stored in the window; at most `max_count` from this queue
    (the caller keeps the oldest `max_count` of all queues)."""
    offset = await _offset_for_time(pool, routes, tq, begin_ms)
    end = await _offset_for_time(pool, routes, tq, end_ms)
    taken = 0
    async for records in read_range(pool, routes, READ_GROUP, tq, offset, end, batch=PULL_BATCH):
        for record in records:
            # A broker's clock may step back within a queue: check each time again.
            if not begin_ms <= record.store_ts_ms < end_ms:
                continue
            if taken >= max_count:
                out.truncated = True
                return
            out.append(record)
            taken += 1


async def _offset_for_time(pool: ConnectionPool, routes: RouteCache, tq: TopicQueue,
                           ts_ms: int) -> int:
    addr = await read_addr(routes, tq)
    resp = await pool.request(addr, RequestCode.OFFSET_FOR_TIME, {
        "topic": tq.topic, "queue_id": tq.queue_id, "ts_ms": max(0, int(ts_ms))})
    return int(resp.fields["offset"])

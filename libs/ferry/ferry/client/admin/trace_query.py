"""Reading a message's trace back from the `%TRACE%` topic of a cluster.

`spans_of_message(namesrv, msg_id)` asks every broker's key index for the spans
whose message concerns `msg_id` (QUERY_BY_KEY on `%TRACE%`), then for every
span of each trace found (key `t:<trace id>`), and returns them once each,
sorted by start time: the message's path hop by hop.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from ferry.auth.credentials import Credentials
from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.client.core.trace_topic import TRACE_KEY_PREFIX
from ferry.codec.record import iter_records
from ferry.errors import FerryError
from ferry.names import TRACE_TOPIC
from ferry.wire import RequestCode, check_response

#: Spans read per key and broker (the broker's own QUERY_BY_KEY maximum).
MAX_SPANS_PER_KEY = 64
#: At most this many traces of one message are followed (a message resent many times).
MAX_TRACES = 8


def is_span(doc: object) -> bool:
    """Whether `doc` looks like span JSON: a dict with str ids and int start/end times.

    `%TRACE%` holds what exporters wrote; anything else there (a foreign or
    broken exporter's body) is skipped rather than failing the reader."""
    if not isinstance(doc, dict):
        return False
    return (isinstance(doc.get("trace_id"), str) and isinstance(doc.get("span_id"), str)
            and _is_int(doc.get("start_ns")) and _is_int(doc.get("end_ns")))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def _query(pool: ConnectionPool, addr: str, key: str) -> list[dict[str, Any]]:
    try:
        resp = check_response(await pool.request(addr, RequestCode.QUERY_BY_KEY, {
            "topic": TRACE_TOPIC, "key": key, "max_count": MAX_SPANS_PER_KEY}))
    except FerryError:   # a broker that never stored a span, or is away: nothing from it
        return []
    out = []
    for rec in iter_records(resp.body):
        try:
            doc = json.loads(bytes(rec.body))
        except ValueError:   # not JSON (UnicodeDecodeError included)
            continue
        if is_span(doc):
            out.append(doc)
    return out


async def _query_all(pool: ConnectionPool, brokers: list[str], key: str
                     ) -> list[dict[str, Any]]:
    found = await asyncio.gather(*(_query(pool, addr, key) for addr in brokers))
    return [doc for docs in found for doc in docs]


async def spans_of_message(namesrv: str, msg_id: str,
                           credentials: Credentials | None = None) -> list[dict[str, Any]]:
    """Every span of every trace the message `msg_id` is part of, sorted by start_ns.

    Requests are signed with `credentials` (default: FERRY_ACCESS_KEY / FERRY_SECRET_KEY).
    """
    credentials = credentials if credentials is not None else Credentials.from_env()
    names = NamesrvClient(namesrv, credentials=credentials)
    pool = ConnectionPool(credentials=credentials)
    try:
        data = await names.call("GET", "/v1/brokers")
        brokers = sorted({b["addr"] for b in data.get("brokers", [])})
        spans = await _query_all(pool, brokers, msg_id.upper())
        traces = list(dict.fromkeys(doc["trace_id"] for doc in spans))[:MAX_TRACES]
        for trace_id in traces:
            spans += await _query_all(pool, brokers, TRACE_KEY_PREFIX + trace_id)
    finally:
        await pool.close()
        await names.close()
    unique = {(doc.get("trace_id"), doc.get("span_id")): doc for doc in spans}
    return sorted(unique.values(), key=lambda doc: doc["start_ns"])

"""Message search (by id, by key, by store time) and a message's page with its trace.

Search runs `Admin.query_message`, `Admin.query_by_key` or
`Admin.messages_by_time` (see ferry.client.admin.query). A message's page shows
where the brokers store it (each broker's newest record of the id: its topic,
or the internal topic it is in now: `%SCHEDULE%`, `%RETRY%<group>`,
`%DLQ%<group>`), the body preview and properties of the record in its real
topic (else the newest), and its trace as a timeline of hops
read from the trace topic.
"""
from __future__ import annotations

import argparse
import time
from typing import Any

from aiohttp import web
from ferry.cli.messages import parse_time_ms
from ferry.client.admin.query import QueryResult, check_msg_id
from ferry.client.core.message import ConsumerRecord
from ferry.codec import ORIGIN_TOPIC
from ferry.errors import FerryError, MalformedRequestError, MessageNotFoundError

from ferry_console.pages.common import console, render, sources
from ferry_console.trace import spans_of, timeline

SEARCH_KINDS = ("id", "key", "time")
DEFAULT_WINDOW = "15m"


def row(r: ConsumerRecord) -> dict[str, Any]:
    return {"msg_id": r.msg_id, "topic": r.stored_topic, "broker": r.broker,
            "queue_id": r.queue_id, "queue_offset": r.queue_offset,
            "store_ts_ms": r.store_ts_ms, "born_ts_ms": r.born_ts_ms, "key": r.key or "",
            "key_list": " ".join(r.keys), "tags": r.tags or "", "reconsume_times": r.reconsume_times,
            "body_size": len(r.body), "origin": r.properties.get(ORIGIN_TOPIC, ""), "preview": r.body[:80].decode("utf-8", errors="replace")}


def _time(text: str, what: str) -> int:
    try:
        return parse_time_ms(text)
    except argparse.ArgumentTypeError as exc:
        raise MalformedRequestError(f"{what}: {exc}") from None


async def search(request: web.Request) -> web.Response:
    c = console(request)
    q = request.query
    kind = q.get("by", "")
    form = {"by": kind or "id", "id": q.get("id", ""), "topic": q.get("topic", ""),
            "key": q.get("key", ""), "from": q.get("from", DEFAULT_WINDOW), "to": q.get("to", "")}
    found: QueryResult | None = None
    error = ""
    if kind:
        try:
            found = await _search(sources(request).admin, kind, form, c.config.list_rows)
        except FerryError as exc:
            error = f"{type(exc).__name__}: {exc}"
    return render(request, "messages.html", title="Messages", form=form, kinds=SEARCH_KINDS,
                  searched=bool(kind), error=error,
                  results=[row(r) for r in found] if found is not None else [],
                  errors=found.errors if found is not None else [],
                  truncated=bool(found is not None and found.truncated))


async def _search(admin: Any, kind: str, form: dict[str, str], limit: int) -> QueryResult:
    if kind == "id":
        return await admin.query_message(form["id"].strip())   # type: ignore[no-any-return]
    topic = form["topic"].strip()
    if not topic:
        raise MalformedRequestError("give the topic to search")
    if kind == "key":
        return await admin.query_by_key(topic, form["key"].strip())  # type: ignore[no-any-return]
    if kind == "time":
        begin = _time(form["from"] or DEFAULT_WINDOW, "from")
        end = _time(form["to"], "to") if form["to"].strip() else int(time.time() * 1000) + 1
        return await admin.messages_by_time(  # type: ignore[no-any-return]
            topic, begin, end, max_count=limit)
    raise MalformedRequestError(f"search by one of {', '.join(SEARCH_KINDS)}, not {kind!r}")


def _main_copy(copies: list[ConsumerRecord]) -> ConsumerRecord:
    """The record in the message's real topic if there is one (else the newest)."""
    real = [r for r in copies if not r.stored_topic.startswith("%")]
    return real[0] if real else copies[-1]


def _preview(body: bytes, limit: int) -> tuple[str, str]:
    """(text, how): UTF-8 text, else a hex dump of the first `limit` bytes."""
    part = body[:limit]
    try:
        return part.decode("utf-8"), "text"
    except UnicodeDecodeError:
        return part.hex(" ", 2), "hex"


async def message(request: web.Request) -> web.Response:
    c = console(request)
    msg_id = check_msg_id(request.match_info["msg_id"])
    copies = list(await sources(request).admin.query_message(msg_id))
    if not copies:
        raise MessageNotFoundError(f"no broker stores a message with id {msg_id}")
    main = _main_copy(copies)
    text, how = _preview(main.body, c.config.preview_bytes)
    trace_error = ""
    try:
        spans = await spans_of(c.config.namesrv, msg_id, sources(request).credentials)
    except FerryError as exc:
        spans, trace_error = [], f"{type(exc).__name__}: {exc}"
    hops = timeline(spans or [])
    return render(request, "message.html", title=f"Message {msg_id}", msg=row(main),
                  copies=[row(r) for r in copies], properties=sorted(main.properties.items()),
                  preview=text, preview_kind=how,
                  preview_truncated=len(main.body) > c.config.preview_bytes,
                  hops=hops, trace_available=spans is not None, trace_error=trace_error,
                  traces=sorted({h.trace_id for h in hops}))


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/console/messages", search)
    router.add_get("/console/messages/{msg_id}", message)

"""The groups page, one group (per-queue lag, members, subscriptions, offset resets), and its
DLQ with resend.

A group's committed offsets, lag and live members come from every broker's
`/v1/stats` (`groups`, `members`); its config from namesrv. The DLQ is read
through `Admin.dead_letters` (what `ferry dlq list` shows) and resent with a
POST form (`ferry dlq resend`), answered with a redirect back to the DLQ page
(post/redirect/get: reloading does not resend).
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web
from ferry.codec import ORIGIN_TOPIC
from ferry.errors import MalformedRequestError
from ferry.names import validate_group

from ferry_console.forms import read_form
from ferry_console.pages.charts import group_charts, stats_were_read
from ferry_console.pages.common import console, render, sources
from ferry_console.pages.offset_resets import recorded
from ferry_console.sources import BrokerView

MAX_RESEND_IDS = 1000


def lag_rows(brokers: list[BrokerView], group: str) -> list[dict[str, Any]]:
    """Per (topic, broker, queue): committed offset, max offset and lag of `group`."""
    rows = []
    for b in brokers:
        if b.stats is None or b.role == "slave":
            continue
        for topic, queues in ((b.stats.get("groups") or {}).get(group) or {}).items():
            for qid, q in queues.items():
                rows.append({"topic": topic, "broker": b.name, "queue_id": int(qid),
                             "committed": q.get("committed_offset", -1),
                             "max_offset": q.get("max_offset", 0), "lag": q.get("lag", 0)})
    rows.sort(key=lambda r: (r["topic"], r["broker"], r["queue_id"]))
    return rows


def members(brokers: list[BrokerView], group: str) -> list[dict[str, Any]]:
    """The live members of `group` as the brokers heard their heartbeats (merged by id)."""
    out: dict[str, dict[str, Any]] = {}
    for b in brokers:
        for m in ((b.stats or {}).get("members") or {}).get(group) or ():
            row = out.setdefault(m["client_id"], {**m, "brokers": []})
            row["brokers"].append(b.name)
    return [out[k] for k in sorted(out)]


def subscriptions(member_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per topic, the distinct subscriptions the members sent (more than one: a conflict)."""
    by_topic: dict[str, dict[str, list[str]]] = {}
    for m in member_rows:
        for topic in m.get("topics") or ():
            sub = (m.get("subscriptions") or {}).get(topic)
            if sub is None:
                what = "(not sent)" if m.get("subscriptions") is None else "*"
            elif sub.get("sql"):
                what = f"SQL: {sub['sql']}"
            elif sub.get("tags"):
                what = "tags: " + " || ".join(sub["tags"])
            else:
                what = "*"
            by_topic.setdefault(topic, {}).setdefault(what, []).append(m["client_id"])
    return [{"topic": t, "filters": [{"filter": f, "members": ms} for f, ms in sorted(v.items())],
             "conflict": len(v) > 1} for t, v in sorted(by_topic.items())]


async def groups(request: web.Request) -> web.Response:
    configs = {str(g.get("name")): g for g in await sources(request).groups()}
    brokers = await sources(request).brokers()
    names = set(configs)
    for b in brokers:
        names.update(((b.stats or {}).get("groups") or {}).keys())
        names.update(((b.stats or {}).get("members") or {}).keys())
    rows = []
    for name in sorted(names):
        lags = lag_rows(brokers, name)
        rows.append({"name": name, "configured": name in configs,
                     "members": len(members(brokers, name)),
                     "topics": sorted({r["topic"] for r in lags}),
                     "lag": sum(int(r["lag"]) for r in lags)})
    return render(request, "groups.html", title="Groups", groups=rows)


async def group(request: web.Request) -> web.Response:
    name = validate_group(request.match_info["group"])
    brokers = await sources(request).brokers()
    lags = lag_rows(brokers, name)
    member_rows = members(brokers, name)
    resets, resets_error = await recorded(request, name)
    return render(request, "group.html", title=f"Group {name}", group=name,
                  config=await sources(request).group_config(name), lags=lags,
                  total_lag=sum(int(r["lag"]) for r in lags), members=member_rows,
                  subscriptions=subscriptions(member_rows), resets=resets,
                  resets_error=resets_error, reset_topic=request.query.get("reset"),
                  charts=await group_charts(console(request), name)
                  if stats_were_read(request, brokers) else None)


async def dlq(request: web.Request) -> web.Response:
    c = console(request)
    name = validate_group(request.match_info["group"])
    records = await sources(request).admin.dead_letters(name).messages(limit=c.config.list_rows)
    rows = [{"msg_id": r.msg_id, "origin": r.properties.get(ORIGIN_TOPIC, ""),
             "broker": r.broker, "queue_id": r.queue_id, "queue_offset": r.queue_offset,
             "store_ts_ms": r.store_ts_ms, "reconsume_times": r.reconsume_times,
             "key": r.key or "", "tags": r.tags or "",
             "preview": r.body[:120].decode("utf-8", errors="replace")} for r in records]
    return render(request, "dlq.html", title=f"DLQ of {name}", group=name, messages=rows,
                  limit=c.config.list_rows, resent=request.query.get("resent"))


async def dlq_resend(request: web.Request) -> web.Response:
    name = validate_group(request.match_info["group"])
    form = await read_form(request)
    every = form.get("all") == "1"
    ids = [str(v) for v in form.getall("id", [])]
    if not every and not ids:
        raise MalformedRequestError("choose the messages to resend, or resend all")
    if len(ids) > MAX_RESEND_IDS:
        raise MalformedRequestError(f"at most {MAX_RESEND_IDS} ids at once")
    sent = await sources(request).admin.dead_letters(name).resend(None if every else ids)
    raise web.HTTPSeeOther(f"/console/groups/{quote(name)}/dlq?resent={len(sent)}")


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/console/groups", groups)
    router.add_get("/console/groups/{group}", group)
    router.add_get("/console/groups/{group}/dlq", dlq)
    router.add_post("/console/groups/{group}/dlq/resend", dlq_resend)

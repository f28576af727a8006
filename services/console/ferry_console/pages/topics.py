"""The topics page (every topic: queues, messages, rate) and one topic's queues."""
from __future__ import annotations

from typing import Any

from aiohttp import web
from ferry.names import validate_topic

from ferry_console.pages.charts import topic_charts, user_reads_stats
from ferry_console.pages.common import console, render, sources
from ferry_console.rates import topic_totals


async def topics(request: web.Request) -> web.Response:
    c = console(request)
    configs = await sources(request).topics()
    brokers = await sources(request).brokers()
    totals = topic_totals(brokers)
    queues: dict[str, int] = {}
    for b in brokers:
        if b.stats is not None and b.role != "slave":
            for topic, qs in (b.stats.get("topics") or {}).items():
                queues[topic] = queues.get(topic, 0) + len(qs)
    rows = []
    for cfg in sorted(configs, key=lambda t: str(t.get("name"))):
        name = str(cfg.get("name"))
        rows.append({"name": name, "type": cfg.get("type", "normal"), "perm": cfg.get("perm", ""),
                     "queues": queues.get(name, 0), "messages": totals.get(name, 0),
                     "rate": c.rates.rate(name)})
    internal = sorted(t for t in totals if t.startswith("%"))
    return render(request, "topics.html", title="Topics", topics=rows,
                  internal=[{"name": t, "messages": totals[t], "rate": c.rates.rate(t)}
                            for t in internal])


async def topic(request: web.Request) -> web.Response:
    c = console(request)
    name = validate_topic(request.match_info["topic"], allow_internal=True)
    described = await sources(request).admin.describe_topic(name)
    queues: list[dict[str, Any]] = described["queues"]
    for q in queues:
        if "max_offset" in q:
            q["stored"] = q["max_offset"] - q["min_offset"]
    return render(request, "topic.html", title=f"Topic {name}", topic=described,
                  queues=queues, rate=c.rates.rate(name),
                  charts=await topic_charts(c, name, await user_reads_stats(request, sources(request))),
                  total=sum(int(q.get("max_offset", 0)) for q in queues))


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/console/topics", topics)
    router.add_get("/console/topics/{topic}", topic)

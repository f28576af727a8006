"""The cluster page: every broker member, its role, health and disk."""
from __future__ import annotations

from typing import Any

from aiohttp import web

from ferry_console.pages.charts import cluster_charts, stats_were_read
from ferry_console.pages.common import console, render, sources
from ferry_console.rates import member_name
from ferry_console.sources import BrokerView


def broker_row(b: BrokerView) -> dict[str, Any]:
    """One member as the cluster table shows it."""
    st = b.stats or {}
    store = st.get("store") or {}
    repl = st.get("replication") or {}
    disk = st.get("disk") or {}
    if b.stats is None:
        health = "unreachable"
    else:
        health = "healthy" if store.get("healthy", True) else "refusing writes"
    return {"name": b.name, "cluster": b.info.get("cluster", ""), "id": b.info.get("id", 0),
            "role": b.role, "epoch": repl.get("epoch", b.info.get("epoch", 0)),
            "addr": b.info.get("addr", ""), "http_addr": b.info.get("http_addr", ""),
            "health": health, "ok": health == "healthy",
            "disk_percent": round(float(store.get("disk_used_ratio", 0)) * 100, 1)
            if b.stats else None,
            # The disk alarm (the broker's disk.py): writes refused until below low water.
            "disk_alarm": bool(disk.get("alarm")),
            "disk_high_percent": round(float(disk.get("high_water_ratio", 0.9)) * 100, 1),
            "disk_held": bool(disk.get("held_by_floor")),
            "commit_log_bytes": int(store.get("commit_log_max_offset", 0))
            - int(store.get("commit_log_min_offset", 0)) if b.stats else None,
            "flush_mode": (st.get("broker") or {}).get("flush_mode", ""),
            "topics": len(st.get("topics") or {}),
            "consumers": sum(len(v) for v in (st.get("consumers") or {}).values()),
            "held_pulls": st.get("held_pulls", 0)}


async def cluster(request: web.Request) -> web.Response:
    c = console(request)
    brokers = await sources(request).brokers()
    topics = await sources(request).topics()
    groups = await sources(request).groups()
    return render(request, "cluster.html", title="Cluster", namesrv=c.config.namesrv,
                  brokers=[broker_row(b) for b in brokers], topic_count=len(topics),
                  group_count=len(groups),
                  charts=await cluster_charts(c, [member_name(b) for b in brokers])
                  if stats_were_read(request, brokers) else None)


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/console", cluster)
    router.add_get("/console/", cluster)
    router.add_get("/console/cluster", cluster)

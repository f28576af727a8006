"""The services page: the delay schedulers', txn-checkers' and dedup's `/v1/stats`.

Each configured address is asked; a nested statistics document is shown as
a flat table of dotted names and values (lists and long values shortened),
so that a new counter in a service appears here without a console change.
"""
from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from ferry_console.pages.common import console, render, sources

MAX_ROWS = 200
MAX_VALUE_CHARS = 160


def flatten(doc: Any, prefix: str = "", out: list[tuple[str, str]] | None = None
            ) -> list[tuple[str, str]]:
    """(dotted name, value text) pairs of a JSON document, at most MAX_ROWS."""
    out = [] if out is None else out
    if isinstance(doc, dict) and doc:
        for key in sorted(doc):
            if len(out) >= MAX_ROWS:
                break
            flatten(doc[key], f"{prefix}.{key}" if prefix else str(key), out)
    elif len(out) < MAX_ROWS:
        text = doc if isinstance(doc, str) else json.dumps(doc)
        if len(text) > MAX_VALUE_CHARS:
            text = text[:MAX_VALUE_CHARS] + "…"
        out.append((prefix or "(value)", text))
    return out


async def services(request: web.Request) -> web.Response:
    c = console(request)
    wanted = [("Delay scheduler", c.config.delay_scheduler),
              ("Transaction checker", c.config.txn_checker),
              ("Dedup", c.config.dedup)]
    answers = await asyncio.gather(*(sources(request).read_json(addr, "/v1/stats")
                                     for _, addr in wanted))
    cards = [{"name": name, "addr": addr, "configured": bool(addr), "up": doc is not None,
              "why": why, "rows": flatten(doc) if doc is not None else []}
             for (name, addr), (doc, why) in zip(wanted, answers, strict=True)]
    return render(request, "services.html", title="Services", services=cards)


def register(router: web.UrlDispatcher) -> None:
    router.add_get("/console/services", services)

"""A group's offset resets in the console: the form on the group page, the plan of a dry
run, and the record of past resets (`ferry group reset-offsets`, docs/operations.md).

The reset runs through `Admin.reset_offsets` with the logged-in user's credentials
(auth on): it needs `reset` on the group like the CLI. A dry run renders its plan
(nothing changes; a button runs it). A reset answers 303 back to the group page
(post/redirect/get: a reload does not reset again), which lists the recorded resets.
"""
from __future__ import annotations

from typing import Any
from urllib.parse import quote

from aiohttp import web
from ferry.client.admin.offset_reset import ResetSpec
from ferry.errors import FerryError, MalformedRequestError
from ferry.names import validate_group, validate_topic

from ferry_console.forms import read_form
from ferry_console.pages.common import render, sources

#: Reset records the group page lists (namesrv keeps 50).
SHOWN_RESETS = 20


async def recorded(request: web.Request, group: str) -> tuple[list[dict[str, Any]], str]:
    """The group's recorded resets (newest first) and why they could not be read ("")."""
    try:
        return (await sources(request).admin.offset_resets(group))[:SHOWN_RESETS], ""
    except FerryError as exc:
        return [], f"{type(exc).__name__}: {exc}"


def _spec(form: Any) -> ResetSpec:
    to = str(form.get("to", ""))
    raw = str(form.get("value", "")).strip()
    if to in ("earliest", "latest"):
        return ResetSpec.from_dict({"to": to})
    if not raw:
        raise MalformedRequestError(f"a reset to {to or '?'} needs a value")
    if to == "time":
        return ResetSpec.from_dict({"to": to, "value": raw})
    try:
        value = int(raw)
    except ValueError:
        raise MalformedRequestError(f"the value must be an integer, not {raw!r}") from None
    return ResetSpec.from_dict({"to": to, "value": value})


async def reset_offsets(request: web.Request) -> web.Response:
    group = validate_group(request.match_info["group"])
    form = await read_form(request)
    topic = validate_topic(form.get("topic"))
    spec = _spec(form)
    dry_run, force = form.get("dry_run") == "1", form.get("force") == "1"
    plan = await sources(request).admin.reset_offsets(group, topic, spec, dry_run=dry_run,
                                                      force=force)
    if dry_run:
        return render(request, "reset_plan.html", title=f"Reset plan of {group}",
                      group=group, plan=plan, value=str(form.get("value", "")), force=force)
    raise web.HTTPSeeOther(f"/console/groups/{quote(group)}?reset={quote(topic)}")


def register(router: web.UrlDispatcher) -> None:
    router.add_post("/console/groups/{group}/reset-offsets", reset_offsets)

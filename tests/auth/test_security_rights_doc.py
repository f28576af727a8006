"""docs/security.md's "What each right allows" against the code, both ways.

For every right (each resource kind and action of `ferry.auth.acl.ACTIONS`) the
table lists the wire requests (`ferry_broker.permissions.PERMISSIONS`) and the
HTTP routes (each service's `permissions.py` table) it allows; a last row lists
the routes any identity may call. Everything is derived from those tables, so a
new resource kind, action, request code or route fails this test until its row
says what it allows, and a row that claims more than the code grants fails too.
"""
from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from typing import Any

from ferry.auth.acl import ACTIONS
from ferry.errors import FerryError
from ferry.service.auth import RouteTable
from ferry.wire import RequestCode
from ferry_broker.permissions import HTTP_ROUTES as BROKER
from ferry_broker.permissions import PERMISSIONS
from ferry_dedup.permissions import ROUTES as DEDUP
from ferry_delay_scheduler.permissions import ROUTES as SCHEDULER
from ferry_namesrv.permissions import ROUTES as NAMESRV
from ferry_txn_checker.permissions import ROUTES as CHECKER

from tests.auth.test_security_doc import _table

HEADING = "### What each right allows"
ANY_IDENTITY = "any identity"
SERVICES: dict[str, RouteTable] = {"namesrv": NAMESRV, "broker": BROKER,
                                   "delay-scheduler": SCHEDULER, "txn-checker": CHECKER,
                                   "dedup": DEDUP}
#: Names a probed rule may be given for a path parameter or a field: plain, and the
#: internal names a rule may treat apart (a group's retry and dead-letter topics).
_PROBE_NAMES = ("probe", "%RETRY%probe", "%DLQ%probe")
#: Body fields a probed rule may read a name from.
_BODY_NAME_FIELDS = ("scene", "topic", "group", "name")


class _Any(dict):  # type: ignore[type-arg]
    """Fields or path parameters where every key holds the same name."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name

    def get(self, key: str, default: Any = None) -> str:  # type: ignore[override]
        return self.name


class _ProbeRequest:
    """What a rule chosen by the request reads: path parameters, query flags, and the body
    (a request's mapping: a JSON object naming `name` under every usual name field)."""

    def __init__(self, name: str, query: Any) -> None:
        self.match_info, self.query = _Any(name), query
        self._body = json.dumps({k: name for k in _BODY_NAME_FIELDS}).encode()

    def get(self, key: str, default: Any = None) -> bytes:
        return self._body


def right(action: str, resource: str) -> str:
    """How a (action, resource) need reads in the table's first column: `kind action`."""
    return f"{resource.partition(':')[0]} {action}"


def wire_rights() -> dict[str, set[str]]:
    """right -> the wire requests it allows (`NAME (+ other needs)` when not alone)."""
    out: dict[str, set[str]] = defaultdict(set)
    for code, alternatives in PERMISSIONS.items():
        for needs in alternatives:
            rights = {right(*need(_Any("probe"))) for need in needs}
            for r in rights:
                others = " + ".join(sorted(rights - {r}))
                out[r].add(RequestCode(code).name + (f" (+ {others})" if others else ""))
    return out


def _probe(rule: Callable[[Any], Iterable[tuple[str, str]]], where: str) -> set[tuple[str, str]]:
    """What a rule chosen by the request can ask for: probed with every flag off and on."""
    got: set[tuple[str, str]] = set()
    answered = False
    for name in _PROBE_NAMES:
        for query in ({}, _Any("1")):
            try:
                got |= set(rule(_ProbeRequest(name, query)))
                answered = True
            except (FerryError, KeyError, ValueError):
                continue
    assert answered, f"{where}: its rule answers no probe; teach _probe its inputs"
    return got


def http_rights() -> dict[str, set[str]]:
    """right (or ANY_IDENTITY) -> the routes it allows, as `service \\`METHOD path\\``."""
    out: dict[str, set[str]] = defaultdict(set)
    for service, table in SERVICES.items():
        for (method, path), rule in table.items():
            entry = f"{service} `{method} {path}`"
            bound = (_probe(rule, entry) if callable(rule)
                     else {(p.action, p.resource) for p in rule})
            if not bound:
                out[ANY_IDENTITY].add(entry)
            for need in bound:
                out[right(*need)].add(entry)
    return out


def _cell(text: str) -> set[str]:
    return set() if text in ("", "—") else {e.strip() for e in text.split(", ")}


def _documented() -> dict[str, tuple[set[str], set[str]]]:
    rows = {}
    for row in _table(HEADING):
        name = row["right"].replace("`", "").replace(":<glob>", "")
        rows[name] = (_cell(row["wire requests"]), _cell(row["HTTP routes"]))
    return rows


def derived_row(name: str) -> str:
    """The row for right `name` as the code has it (what a failure asks to paste)."""
    kind, _, action = name.partition(" ")
    label = (ANY_IDENTITY if name == ANY_IDENTITY
             else f"`{kind}` `{action}`" if kind in ("admin", "broker")
             else f"`{kind}:<glob>` `{action}`")
    wire = sorted(wire_rights().get(name, set()), key=lambda e: (" (+" in e, e))
    order = list(SERVICES)
    http = sorted(http_rights().get(name, set()),
                  key=lambda e: (order.index(e.split(" ")[0]), e.split(" ")[2], e))
    return f"| {label} | {', '.join(wire) or '—'} | {', '.join(http) or '—'} | |"


def test_every_right_has_a_row_and_no_row_names_another() -> None:
    rights = {f"{kind} {action}" for kind, actions in ACTIONS.items() for action in actions}
    documented = set(_documented())
    missing = "\n".join(derived_row(r) for r in sorted(rights - documented))
    assert documented == rights | {ANY_IDENTITY}, f"rows to add:\n{missing}"


def test_each_right_allows_the_wire_requests_its_row_lists() -> None:
    wire = wire_rights()
    for name, (documented, _) in _documented().items():
        assert documented == wire.get(name, set()), f"the row should be:\n{derived_row(name)}"


def test_each_right_allows_the_http_routes_its_row_lists() -> None:
    http = http_rights()
    for name, (_, documented) in _documented().items():
        assert documented == http.get(name, set()), f"the row should be:\n{derived_row(name)}"


def test_every_request_code_and_route_is_in_the_table() -> None:
    rows = _documented().values()
    wire = {e.split(" ")[0] for documented, _ in rows for e in documented}
    assert wire == {RequestCode(code).name for code in PERMISSIONS}
    routes = {e for _, documented in rows for e in documented}
    assert routes == {f"{s} `{m} {p}`" for s, table in SERVICES.items() for m, p in table}

"""docs/security.md's "HTTP APIs" against the code: the worked HTTP signing example and the
route -> permission tables of namesrv, the scheduler, the txn-checker and dedup."""
from __future__ import annotations

import pytest
from ferry.auth.credentials import Credentials
from ferry.auth.http import signed_headers
from ferry.auth.signing import string_to_sign_http
from ferry.service.auth import RouteTable
from ferry_dedup.permissions import ROUTES as DEDUP
from ferry_delay_scheduler.permissions import ROUTES as SCHEDULER
from ferry_namesrv.permissions import ROUTES as NAMESRV
from ferry_txn_checker.permissions import ROUTES as CHECKER

from tests.auth.test_security_doc import TEXT

QUERY = [("state", "open"), ("limit", "10")]
TARGET = "txn-checker/host-1:10924"


def _table(heading: str) -> dict[str, str]:
    """The first table after the line `heading` (in "HTTP APIs"): route -> needs."""
    lines = TEXT[TEXT.index("## HTTP APIs"):].splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return {r[0].strip("`"): r[1] for r in rows[2:]}


def _words(rule: object) -> str | None:
    if callable(rule):
        return None   # chosen by the request: its row is prose
    perms = list(rule)  # type: ignore[call-overload]
    if not perms:
        return "any identity"
    return " or ".join(f"admin {p.action}" if p.resource == "admin"
                       else f"{p.action} {p.resource}" for p in perms)


def test_worked_http_example_matches_the_code() -> None:
    data = string_to_sign_http(TARGET, "alice", 1700000000123, bytes(range(16)).hex(), "GET",
                               "/v1/transactions", QUERY, b"")
    assert "\n".join("    " + line for line in data.decode().split("\n")) in TEXT
    headers = signed_headers(Credentials("alice", "alice-secret-0123456789"), TARGET, "GET",
                             "/v1/transactions", QUERY, b"", ts_ms=1700000000123,
                             nonce=bytes(range(16)))
    assert f"X-Ferry-Signature: {headers['X-Ferry-Signature']}" in TEXT


@pytest.mark.parametrize("heading,table", [("namesrv:", NAMESRV), ("delay scheduler:", SCHEDULER),
                                           ("txn-checker:", CHECKER), ("dedup:", DEDUP)])
def test_route_tables_match_the_services(heading: str, table: RouteTable) -> None:
    documented = _table(heading)
    assert set(documented) == {f"{m} {p}" for m, p in table}
    for (method, path), rule in table.items():
        words = _words(rule)
        if words is not None:
            assert documented[f"{method} {path}"] == words, (method, path)

"""docs/security.md against the code: the worked signing example, the permission table of
the wire requests and the rule vocabulary."""
from __future__ import annotations

import re
from pathlib import Path

import msgpack
from ferry.auth.acl import ACTIONS
from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_wire, string_to_sign_wire
from ferry.wire import RequestCode
from ferry_broker.permissions import PERMISSIONS

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
TEXT = DOC.read_text(encoding="utf-8")
# How each need of ferry_broker.permissions reads in the table.
_NEED_WORDS = {"_pub": "pub topic", "_sub": "sub topic", "_consume": "consume group",
               "_reset": "reset group",
               "_commit": "consume group (reset group when flagged `reset`)"}


def _table(heading: str) -> list[dict[str, str]]:
    """The first markdown table after `heading`, as rows keyed by column name."""
    lines = TEXT.splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


def _words(need: object) -> str:
    name = getattr(need, "__name__", "")
    return _NEED_WORDS.get(name) or "admin " + name.removeprefix("admin_")


def test_worked_example_matches_the_code() -> None:
    creds = Credentials("alice", "alice-secret-0123456789")
    fields = {"topic": "orders", "queue_id": 0}
    nonce = bytes(range(16))
    assert f"K = {creds.signing_key.hex()}" in TEXT
    assert msgpack.packb(fields).hex() in TEXT
    target = "DefaultCluster/broker-a/0"
    data = string_to_sign_wire(target, "alice", 1700000000123, nonce, RequestCode.GET_MIN_MAX,
                               fields, b"")
    assert "\n".join("    " + line for line in data.decode().split("\n")) in TEXT
    auth = sign_wire(creds, target, RequestCode.GET_MIN_MAX, fields, b"", ts_ms=1700000000123,
                     nonce=nonce)
    assert f"s = {auth['s'].hex()}" in TEXT


def test_permission_table_matches_the_broker() -> None:
    documented = {int(r["code"]): (r["name"], r["needs"])
                  for r in _table("### Wire requests")}
    actual = {int(code): (RequestCode(code).name,
                          " or ".join(" + ".join(_words(n) for n in needs) for needs in alts))
              for code, alts in PERMISSIONS.items()}
    assert documented == actual


def test_resource_actions_match_the_acl() -> None:
    rows = {r["resource"].split(":")[0].strip("`"): r["actions"]
            for r in _table("### Rules")}
    for kind, actions in ACTIONS.items():
        assert set(re.findall(r"`(\w+)`", rows[kind])) == set(actions), kind

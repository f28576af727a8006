"""docs/replication.md "Protocol" against the code: frame layouts, type codes, limits.

The page is written for people; this test parses its tables so that the page and
`ferry_broker.replication` cannot drift apart.
"""
from __future__ import annotations

import struct
from pathlib import Path

import pytest
from ferry_broker.replication import admission, follower, link, master
from ferry_broker.replication import protocol as p

DOC = Path(__file__).resolve().parents[2] / "docs" / "replication.md"
_CHARS = {("u32", 4): "I", ("u16", 2): "H", ("u8", 1): "B", ("i64", 8): "q",
          ("bytes", 16): "16s", ("bytes", 32): "32s"}


def _table(heading: str) -> list[dict[str, str]]:
    """The first markdown table after `heading`, as rows keyed by column name."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) >= 3, f"no table under {heading!r}"
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


def _fixed(heading: str) -> struct.Struct:
    """The struct of a table's fixed-size prefix; offsets checked on the way."""
    fmt, offset = "<", 0
    for row in _table(heading):
        if not row["size"].isdigit():
            assert row["offset"] == str(offset), f"{heading}: {row['field']} not at {offset}"
            break
        assert int(row["offset"]) == offset, f"{heading}: {row['field']} at the wrong offset"
        fmt += _CHARS[(row["type"], int(row["size"]))]
        offset += int(row["size"])
    return struct.Struct(fmt)


@pytest.mark.parametrize(("heading", "code"), [
    ("### Frame", p.LENGTH.format + p.TYPE.format.lstrip("<")),
    ("### HELLO", p.HELLO_HEAD.format),
    ("### WELCOME", p.WELCOME_HEAD.format),
    ("### REFUSE", p.I64.format),
    ("### DATA", p.DATA_HEAD.format),
    ("### ACK and HEARTBEAT", p.I64.format),
    ("### AUTH", p.AUTH_HEAD.format),
])
def test_fixed_layouts(heading: str, code: str) -> None:
    assert _fixed(heading).format == code


def test_frame_types() -> None:
    rows = _table("### Frame types")
    assert {r["name"]: int(r["type"]) for r in rows} == {t.name: t.value for t in p.FrameType}


def test_limits() -> None:
    modules = {"protocol": p, "master": master, "follower": follower,
               "admission": admission, "link": link}
    rows = _table("### Limits")
    for row in rows:
        assert getattr(modules[row["where"]], row["constant"]) == int(row["value"]), row
    assert len(rows) == 16


def test_hello_magic_and_version() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert p.MAGIC.to_bytes(4, "little") == b"FRYR" and p.VERSION == 1
    assert "`magic` is `0x52595246` (`b\"FRYR\"`), `version` is `1`" in text

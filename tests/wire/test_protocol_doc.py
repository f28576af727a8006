"""docs/protocol.md against the code: every table the page declares is checked here.

The page is written by hand for people; this test parses its tables so that
the document and `ferry.wire` / `ferry.errors` cannot drift apart.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import ferry.wire as wire
import msgpack
import pytest
from ferry.codec.entry import ENTRY_HEAD, ENTRY_HEAD_FIELDS
from ferry.errors import ERRORS_BY_CODE
from ferry.wire import Flag, RequestCode, encode_frame, error_response, request, response
from ferry.wire.frame import FRAME_PREFIX_FIELDS, HEADER_KEYS

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
# Doc type name -> struct format character(s) for a field of the documented size.
_STRUCT_CHARS = {("u32", 4): "I", ("u16", 2): "H", ("i64", 8): "q", ("bytes", 16): "16s"}


def _table(heading: str) -> list[dict[str, str]]:
    """The first markdown table after `heading`, as rows keyed by column name."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("#") and rows == []:
            continue
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) >= 3, f"no table under {heading!r}"
    names, body = rows[0], rows[2:]
    return [dict(zip(names, r, strict=True)) for r in body]


def _unquote(cell: str) -> str:
    return cell.strip("`")


def _fixed_layout(rows: list[dict[str, str]]) -> tuple[str, list[str], int]:
    """Struct format, field names and the next offset of a table's fixed-size prefix."""
    fmt, names, offset = "<", [], 0
    for row in rows:
        if not row["size"].isdigit():
            assert row["offset"] == str(offset), f"{row['field']} should start at {offset}"
            break
        size = int(row["size"])
        assert int(row["offset"]) == offset, f"{row['field']} is documented at the wrong offset"
        fmt += _STRUCT_CHARS[(row["type"], size)]
        names.append(row["field"])
        offset += size
    return fmt, names, offset


def test_frame_prefix_table() -> None:
    fmt, names, end = _fixed_layout(_table("## Frame"))
    assert fmt == wire.FRAME_PREFIX.format
    assert tuple(names) == FRAME_PREFIX_FIELDS
    assert end == wire.FRAME_PREFIX.size == 8


def test_message_entry_table() -> None:
    fmt, names, end = _fixed_layout(_table("## Message batch (SEND body)"))
    assert struct.calcsize(fmt) == ENTRY_HEAD.size == end == 44
    assert fmt == ENTRY_HEAD.format
    assert tuple(names) == ENTRY_HEAD_FIELDS


def test_header_keys_table() -> None:
    rows = _table("## Header")
    assert tuple(_unquote(r["key"]) for r in rows) == HEADER_KEYS
    required = {_unquote(r["key"]) for r in rows if r["required"] == "yes"}
    minimal = msgpack.unpackb(encode_frame(request(RequestCode.PULL, 1))[8:])
    assert set(minimal) == required
    full = error_response(request(RequestCode.PULL, 1, {"a": 1}), ValueError())
    full.fields = {"a": 1}
    full.auth = {"k": "alice"}
    assert set(msgpack.unpackb(encode_frame(full)[8:])) == set(HEADER_KEYS)
    flags_cell = next(r["meaning"] for r in rows if r["key"] == "`f`")
    documented = {name: int(value) for name, value in re.findall(r"`(\w+)` \((\d+)\)", flags_cell)}
    assert documented == {f.name: f.value for f in Flag}
    version_cell = next(r["meaning"] for r in rows if r["key"] == "`v`")
    assert f"`{wire.PROTOCOL_VERSION}`" in version_cell


def test_request_code_table() -> None:
    rows = _table("## Request codes")
    assert {r["name"]: int(r["code"]) for r in rows} == {c.name: c.value for c in RequestCode}
    # Each code has its own section, titled "### <code> <NAME>".
    text = DOC.read_text(encoding="utf-8")
    for code in RequestCode:
        assert f"\n### {code.value} {code.name}\n" in text


def test_error_code_table() -> None:
    rows = _table("## Error codes")
    documented = {int(r["code"]): (_unquote(r["class"]), r["retriable"]) for r in rows}
    actual = {code: (cls.__name__, "yes" if cls.retriable else "no")
              for code, cls in ERRORS_BY_CODE.items()}
    assert documented == actual


@pytest.mark.parametrize("row", _table("## Limits"), ids=lambda r: r["limit"])
def test_limits_table(row: dict[str, str]) -> None:
    numbers = re.findall(r"\d+", row["value"])
    value = int(numbers[-1])
    for const in re.findall(r"`(\w+)`", row["constant"]):
        assert getattr(wire, const) == value, const


def test_message_flags_table_matches_the_code() -> None:
    from ferry.codec import MessageFlag

    lines = [line.strip() for line in DOC.read_text(encoding="utf-8").splitlines()]
    start = lines.index("| bit | name | meaning |")
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    assert {_unquote(name): int(bit) for bit, name, _ in rows} == \
        {flag.name: int(flag) for flag in MessageFlag}


def _hex_blocks(heading: str) -> list[bytes]:
    """The ```text blocks of hex bytes after `heading`, up to the next heading."""
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index(heading):]
    section = section[:section.index("\n### ", 1)]
    return [bytes.fromhex(" ".join(b.split()))
            for b in re.findall(r"```text\n(.*?)```", section, flags=re.S)]


def test_history_diverged_example_is_what_the_code_encodes() -> None:
    req = request(RequestCode.PULL, 7, {"group": "g", "topic": "t", "queue_id": 0,
                                        "offset": 1500, "hist": "L9f3c0a12b4d5e6f7"})
    resp = response(req, {"status": "HISTORY_DIVERGED", "next_offset": 1200, "min_offset": 0,
                          "max_offset": 1350, "hist": "E4"})
    asked, answered = _hex_blocks("#### HISTORY_DIVERGED, byte by byte")
    assert asked == encode_frame(req) and len(asked) == 84
    assert answered == encode_frame(resp) and len(answered) == 98

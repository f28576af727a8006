"""docs/store-format.md against the code: every byte table is checked against its struct.

The page is written for people; this test parses its tables so that the
document and `ferry.store` / `ferry.codec` cannot drift apart.
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

import pytest
from ferry.codec import entry, limits, record
from ferry.store import checkpoint, consume_queue, dispatch, index_file

DOC = Path(__file__).resolve().parents[2] / "docs" / "store-format.md"
_CHARS = {"u8": "B", "u16": "H", "u32": "I", "u64": "Q", "i32": "i", "i64": "q"}

# heading -> (struct in the code, field names in the code or None when it names none)
TABLES: dict[str, tuple[struct.Struct, tuple[str, ...] | None]] = {
    "### Record header": (record.HEADER, record.HEADER_FIELDS),
    "### Blank marker": (record.BLANK, record.BLANK_FIELDS),
    "### Checkpoint file": (checkpoint.CHECKPOINT, checkpoint.CHECKPOINT_FIELDS),
    "### CQ_ENTRY": (consume_queue.CQ_ENTRY, None),
    "### INDEX_HEADER": (index_file.INDEX_HEADER, None),
    "### INDEX_SLOT": (index_file.INDEX_SLOT, None),
    "### INDEX_ENTRY": (index_file.INDEX_ENTRY, None),
    "### Message batch input entry": (entry.ENTRY_HEAD, entry.ENTRY_HEAD_FIELDS),
}


def _table(heading: str) -> list[dict[str, str]]:
    """The first markdown table after `heading`, rows keyed by column name."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index(heading)
    rows: list[list[str]] = []
    for line in lines[start + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    assert len(rows) >= 3, f"no table under {heading!r}"
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


def _char(doc_type: str, size: int) -> str:
    m = re.fullmatch(r"(\d+)s", doc_type)
    if m:
        assert int(m.group(1)) == size, f"{doc_type} documented with size {size}"
        return doc_type
    char = _CHARS[doc_type]
    assert struct.calcsize("<" + char) == size, f"{doc_type} documented with size {size}"
    return char


@pytest.mark.parametrize("heading", list(TABLES))
def test_table_matches_struct(heading: str) -> None:
    code, names = TABLES[heading]
    rows = _table(heading)
    fmt, offset = "<", 0
    for row in rows:
        assert int(row["offset"]) == offset, f"{heading}: {row['field']} is not at {offset}"
        fmt += _char(row["type"], int(row["size"]))
        offset += int(row["size"])
    assert fmt == code.format, f"{heading}: the doc says {fmt}, the code {code.format}"
    assert offset == code.size
    if names is not None:
        assert tuple(r["field"] for r in rows) == names


def test_variable_parts_in_order() -> None:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = lines.index("| part | length field | content |")
    parts = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        parts.append([c.strip() for c in line.strip().strip("|").split("|")])
    assert tuple(p[0] for p in parts) == record.VARIABLE_PARTS
    assert tuple(p[1] for p in parts) == record.PART_LENGTH_FIELDS
    assert set(record.PART_LENGTH_FIELDS) <= set(record.HEADER_FIELDS)


def test_constants_and_sizes_stated_in_prose() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name, value in (("RECORD_MAGIC", record.RECORD_MAGIC),
                        ("BLANK_MAGIC", record.BLANK_MAGIC),
                        ("CHECKPOINT_MAGIC", checkpoint.CHECKPOINT_MAGIC)):
        assert f"`{name}` = `0x{value:08X}`" in text, name
    assert f"The fixed header is {record.HEADER_SIZE} bytes" in text
    assert f"`<root>/checkpoint` is {checkpoint.CHECKPOINT.size} bytes" in text
    assert f"bytes `[{record.CRC_START}, total_size)`" in text
    assert f"CRC32C of bytes `[0, {checkpoint.CHECKPOINT.size - 4})`" in text
    assert index_file.INDEX_MAGIC == b"FIDX" and "`b\"FIDX\"`" in text


@pytest.mark.parametrize("row", _table("### Limits"), ids=lambda r: r["limit"])
def test_limits_table(row: dict[str, str]) -> None:
    """Each documented limit is the value of the codec constant(s) it names."""
    value = int(re.findall(r"\d+", row["value"])[-1])
    for const in re.findall(r"`(\w+)`", row["constant"]):
        assert getattr(limits, const) == value, const


def test_every_codec_limit_is_documented() -> None:
    documented = {c for r in _table("### Limits") for c in re.findall(r"`(\w+)`", r["constant"])}
    assert documented == {n for n in vars(limits) if n.startswith(("MAX_", "MSG_"))}


def test_dispatch_backlog_stated_in_prose() -> None:
    assert f"at the latest after {dispatch.DISPATCH_BACKLOG} queued keys" in \
        DOC.read_text(encoding="utf-8")

"""docs/delay.md against the code: the file tables, the entry states and the settings."""
from __future__ import annotations

import dataclasses
import re
import struct
from pathlib import Path

import pytest
from ferry_delay_scheduler import wheel_files as wf
from ferry_delay_scheduler.cancels import CANCELLED_PREFIX
from ferry_delay_scheduler.config import ENV_PREFIX, SchedulerConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "delay.md"
_CHARS = {"u8": "B", "u16": "H", "u32": "I", "i32": "i", "i64": "q", "u64": "Q"}

TABLES: dict[str, tuple[struct.Struct, tuple[str, ...]]] = {
    "### File header": (wf.FILE_HEADER, wf.FILE_HEADER_FIELDS),
    "### Bucket entry": (wf.BUCKET_ENTRY, wf.BUCKET_ENTRY_FIELDS),
    "### Journal entry": (wf.JOURNAL_ENTRY, wf.JOURNAL_ENTRY_FIELDS),
}


def _table(heading: str) -> list[dict[str, str]]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            rows.append([c.strip() for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


@pytest.mark.parametrize("heading", list(TABLES))
def test_file_tables_match_the_structs(heading: str) -> None:
    code, names = TABLES[heading]
    rows = _table(heading)
    assert tuple(r["field"] for r in rows) == names
    fmt = "<"
    offset = 0
    for r in rows:
        assert int(r["offset"]) == offset, r
        size = int(r["size"])
        m = re.fullmatch(r"(\d+)s", r["type"])
        fmt += r["type"] if m else _CHARS[r["type"]]
        offset += size
    assert struct.calcsize(fmt) == code.size == offset
    assert fmt == code.format


def test_entry_size_and_magic_are_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert wf.ENTRY_SIZE == wf.BUCKET_ENTRY.size == wf.JOURNAL_ENTRY.size == 24
    assert f"`magic` is `{wf.FILE_MAGIC.decode()}`" in text
    for state in wf.EntryState:
        assert f"{int(state)} {state.name}" in text


def test_cancel_book_key_is_documented() -> None:
    # Replaces the old progress-file table: the scheduler's disk is a cache now; what
    # survives a failover is the brokers' %SCHEDULE% and the cancel book in etcd.
    assert f"`<prefix>{CANCELLED_PREFIX}<MSG_ID>`" in DOC.read_text(encoding="utf-8")


def test_every_setting_is_documented_with_its_default() -> None:
    rows = {r["variable"].strip("`"): r["default"] for r in _table("## Configuration")}
    for f in dataclasses.fields(SchedulerConfig):
        # `auth` is the one switch every service shares: FERRY_AUTH
        name = "FERRY_AUTH" if f.name == "auth" else ENV_PREFIX + f.name.upper()
        assert name in rows, name
        documented = re.match(r"`([^`]*)`", rows[name])
        assert documented is not None and documented.group(1) == str(f.default), name
    assert len(rows) == len(dataclasses.fields(SchedulerConfig))

"""docs/transactions.md ("The txn-checker") against the code: settings and checkpoint keys."""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

from ferry_txn_checker import checkpoint
from ferry_txn_checker.config import ENV_PREFIX, CheckerConfig
from ferry_txn_checker.state import COUNTERS, Book

DOC = Path(__file__).resolve().parents[2] / "docs" / "transactions.md"


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


def test_every_setting_is_documented_with_its_default() -> None:
    rows = {r["variable"].strip("`"): r["default"] for r in _table("### txn-checker configuration")}
    for f in dataclasses.fields(CheckerConfig):
        # `auth` is the one switch every service shares: FERRY_AUTH
        name = "FERRY_AUTH" if f.name == "auth" else ENV_PREFIX + f.name.upper()
        assert name in rows, name
        documented = re.match(r"`([^`]*)`", rows[name])
        assert documented is not None and documented.group(1) == str(f.default), name
    assert len(rows) == len(dataclasses.fields(CheckerConfig))


def test_checkpoint_keys_are_documented() -> None:
    keys = {r["key"].strip("`") for r in _table("### Checkpoint file")}
    book = Book(default_immunity_ms=0, max_open=1, max_discarded=1, max_recent=1)
    doc = json.loads(checkpoint.encode(book.snapshot()))
    assert keys == set(doc)
    assert f"`<data_dir>/{checkpoint.CHECKPOINT_FILE}`" in DOC.read_text(encoding="utf-8")


def test_stats_counters_are_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in COUNTERS:
        assert f"`{name}`" in text, name

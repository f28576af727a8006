"""docs/filter.md against the code: the limits table and the examples table."""
from __future__ import annotations

from pathlib import Path

import ferry.filter
from ferry.filter import compile_sql

DOC = Path(__file__).resolve().parents[2] / "docs" / "filter.md"
EXAMPLE = ({"amount": "150", "region": "eu", "vip": "true"}, "paid", "k1 k2")


def _table(heading: str) -> list[dict[str, str]]:
    """The first table after `heading`, as rows of column -> cell (backquotes stripped)."""
    lines = DOC.read_text(encoding="utf-8").splitlines()
    rows: list[list[str]] = []
    for line in lines[lines.index(heading) + 1:]:
        if line.startswith("|"):
            rows.append([c.strip().strip("`") for c in line.strip().strip("|").split("|")])
        elif rows:
            break
    return [dict(zip(rows[0], r, strict=True)) for r in rows[2:]]


def test_limits_table_matches_the_constants() -> None:
    rows = _table("## Limits")
    assert {r["constant"]: int(r["value"]) for r in rows} == {
        name: getattr(ferry.filter, name) for name in
        ("MAX_SQL_CHARS", "MAX_NESTING_DEPTH", "MAX_CACHED_FILTERS", "MAX_SUBSCRIBED_TAGS")}


def test_examples_table_is_what_the_filter_does() -> None:
    rows = _table("### Examples")
    assert len(rows) >= 10
    for row in rows:
        assert compile_sql(row["selector"]).evaluate(*EXAMPLE) is (row["takes it"] == "yes"), row

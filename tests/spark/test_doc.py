"""docs/spark.md against the code: the schema, the options, the write columns and the limits."""
from __future__ import annotations

import importlib
from pathlib import Path

from ferry_spark import SCHEMA
from ferry_spark.source.options import READ_OPTIONS
from ferry_spark.source.writer import _COLUMN_TYPES

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


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


def _name(cell: str) -> list[str]:
    return [part.strip().strip("`") for part in cell.split("/")]


def test_schema_table_is_the_schema() -> None:
    rows = _table("### Schema")
    assert [r["column"].strip("`") for r in rows] == SCHEMA.fieldNames()
    for r, f in zip(rows, SCHEMA.fields, strict=True):
        spelled = {"integer": "int", "map": "map<string,string>"}  # as the doc writes them
        name = f.dataType.typeName()
        assert r["type"] == spelled.get(name, name), f.name


def test_read_options_table_lists_every_option() -> None:
    names = {n.lower() for r in _table("### Read options") for n in _name(r["option"])}
    assert names == set(READ_OPTIONS)


def test_write_columns_table_lists_every_column() -> None:
    assert {r["column"].strip("`") for r in _table("### Writing")} == set(_COLUMN_TYPES)


def test_limits_table_matches_the_constants() -> None:
    rows = _table("### Limits")
    assert rows
    for r in rows:
        module, name = r["constant"].strip("`").split(".")
        value = getattr(importlib.import_module(f"ferry_spark.source.{module}"), name)
        assert str(value) == r["value"], name

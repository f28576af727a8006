"""Values a page states beside a name: "`MAX_PULL_WAIT_MS` (15 s)", "`MAX_DELAY_MS`
(30 days)", "`FERRY_DEDUP_RECONCILE_INTERVAL_S` (300)" match the code."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, lines, page_id
from tests.docs.source import config_defaults, numeric_constants

STATED = re.compile(r"`([A-Z][A-Z0-9_]+)`\s*\(([\d,.]+)\s*([A-Za-z]+)?[,;)]")
# Each unit in the unit of a name's suffix (a name without one takes a bare number).
UNITS: dict[str, dict[str | None, float]] = {
    "_BYTES": {None: 1, "B": 1, "bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30},
    "_MS": {None: 1, "ms": 1, "s": 1000, "min": 60_000, "h": 3_600_000, "hours": 3_600_000,
            "day": 86_400_000, "days": 86_400_000},
    "_S": {None: 1, "s": 1, "min": 60, "h": 3600, "hours": 3600, "day": 86_400, "days": 86_400},
    "_HOURS": {None: 1, "h": 1, "hours": 1, "day": 24, "days": 24},
}


def _in_code_units(name: str, number: float, unit: str | None) -> float | None:
    """The stated value in the unit the name's suffix says, or None for a unit that is not
    one of its units (the parenthesis is then prose, not a value)."""
    for suffix, units in UNITS.items():
        if re.search(suffix + "(_|$)", name):  # MAX_UNWRITTEN_BYTES_PER_CONN is in bytes
            return number * units[unit] if unit in units else None
    return number if unit is None else None


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:  # "0..1023"
        return None


def _code_values(name: str) -> set[float]:
    values = set(numeric_constants().get(name, ()))
    for variable, default in config_defaults().items():
        if (variable == name or variable.endswith("_" + name)) \
                and isinstance(default, int | float) and not isinstance(default, bool):
            values.add(default)
    return values


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_stated_values_match_the_code(page: Path) -> None:
    """A name the code gives a number (a constant, an enum member or a service setting) and
    the value a page states for it in parentheses agree."""
    bad = []
    for number, line in lines(page):
        for m in STATED.finditer(line):
            name, unit = m.group(1), m.group(3)
            value = _number(m.group(2))
            stated = None if value is None else _in_code_units(name, value, unit)
            code = _code_values(name)
            if stated is not None and code and stated not in code:
                bad.append(f"{page_id(page)}:{number}: {name} stated {m.group(2)}"
                           f"{' ' + unit if unit else ''}, code {sorted(code)}")
    assert not bad, "values that differ from the code:\n" + "\n".join(bad)


VALUE_CELL = re.compile(r"([\d,.]+)\s*([A-Za-z]+)?")


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_limit_tables_match_the_code(page: Path) -> None:
    """A table row whose cell names a constant right after the cell with its value
    (`| frame size | 16 MiB | `MAX_FRAME_BYTES` | ... |`): the two agree."""
    bad = []
    for number, line in lines(page):
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        for before, cell in zip(cells, cells[1:], strict=False):
            name, value = re.match(r"`([A-Z][A-Z0-9_]+)`", cell), VALUE_CELL.fullmatch(before)
            if not (name and value):
                continue
            amount = _number(value.group(1))
            stated = None if amount is None else _in_code_units(name.group(1), amount,
                                                                value.group(2))
            code = _code_values(name.group(1))
            if stated is not None and code and stated not in code:
                bad.append(f"{page_id(page)}:{number}: {name.group(1)} stated {before}, "
                           f"code {sorted(code)}")
    assert not bad, "limits that differ from the code:\n" + "\n".join(bad)

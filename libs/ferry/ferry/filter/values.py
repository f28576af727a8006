"""How a property's text becomes a number or a boolean when a selector compares it.

Every user property is text on the wire. A selector compares it as a number
only when the other side is a number (or both sides are properties holding
numbers), and as a boolean only against TRUE/FALSE. What counts as a number
is exactly what the grammar accepts as a numeric literal: an optional `-`,
ASCII digits, and an optional `.` followed by digits. No spaces, no `+`, no
exponent (`1e3` is text), no `_`, no `inf`/`nan`. That keeps `'1e3'`, `' 5'`
and `'0x10'` plain strings, as a reader of the message would expect.
"""
from __future__ import annotations

import re

Number = int | float
Value = str | int | float | bool | None

_NUMBER_RE = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def as_number(text: str) -> Number | None:
    """The number `text` spells (int, or float when it has a fraction), None when it spells none."""
    if text.isascii() and text.isdigit():  # the common case first: a plain count or amount
        try:
            return int(text)
        except ValueError:  # more digits than int() takes (sys.int_info.default_max_str_digits)
            return None
    if _NUMBER_RE.fullmatch(text) is None:
        return None
    try:
        return float(text) if "." in text else int(text)
    except ValueError:
        return None


def as_bool(text: str) -> bool | None:
    """True for 'true', False for 'false' (any case), None for any other text."""
    low = text.lower()
    if low == "true":
        return True
    if low == "false":
        return False
    return None


def kind_of(value: Value) -> str:
    """'bool', 'number' or 'string': the type a comparison needs both sides to share."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "number"
    return "string"

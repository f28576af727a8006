"""Environment values as typed values: the parsing every reader of FERRY_* variables shares.

A leaf like `errors` and `names`: it imports nothing of Ferry, so that
telemetry, auth and the service kit (`ferry.service.config`) can all read a
switch the same way.
"""
from __future__ import annotations

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def parse_bool(raw: str, what: str, error: type[ValueError] = ValueError) -> bool:
    """`raw` as a bool: 1/true/yes/on or 0/false/no/off in any case; `what` names it."""
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise error(f"{what} must be true or false, not {raw!r}")

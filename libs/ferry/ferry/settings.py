"""Service settings from the environment: one frozen dataclass built from FERRY_<SERVICE>_<KEY>.

Every service's config is a frozen dataclass whose fields are its settings;
`from_env` fills it from `<prefix><FIELD>` variables (parsed by each field's
type), then lets `overrides` (command-line flags, non-None values) win. The
dataclass's own `__post_init__` still checks ranges: this module only turns
strings into typed values and names the variable when one cannot be.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, TypeVar

T = TypeVar("T")

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
# A field with this name is upper-cased wherever it comes from ("debug" -> "DEBUG").
LOG_LEVEL_FIELD = "log_level"


def from_env(cls: type[T], prefix: str, env: Mapping[str, str] | None = None,
             overrides: Mapping[str, Any] | None = None,
             error: type[ValueError] = ValueError) -> T:
    """Build the dataclass `cls` from `<prefix><FIELD>` variables, then `overrides`.

    A variable set to an empty string (or only spaces) counts as unset unless its
    field is a string, where "" is a value ("no etcd"). A value that does not parse
    raises `error` naming the variable; `overrides` keys must be field names.
    """
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        raw = env.get(prefix + f.name.upper())
        if raw is None:
            continue
        type_name = _type_name(f.type)
        raw = raw.strip()
        if raw != "" or type_name == "str":
            values[f.name] = parse_value(raw, type_name, prefix + f.name.upper(), error)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = value
    if LOG_LEVEL_FIELD in values:
        values[LOG_LEVEL_FIELD] = str(values[LOG_LEVEL_FIELD]).upper()
    return cls(**values)


def parse_value(raw: str, type_name: str, what: str,
                error: type[ValueError] = ValueError) -> Any:
    """`raw` as a value of the type named `type_name` ("int", "float", "bool", "str")."""
    if type_name == "bool":
        return parse_bool(raw, what, error)
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
    except ValueError:
        kind = "a number (an integer)" if type_name == "int" else "a number"
        raise error(f"{what} must be {kind}, not {raw!r}") from None
    return raw


def parse_bool(raw: str, what: str, error: type[ValueError] = ValueError) -> bool:
    """`raw` as a bool: 1/true/yes/on or 0/false/no/off in any case; `what` names it."""
    low = raw.strip().lower()
    if low in TRUE_WORDS:
        return True
    if low in FALSE_WORDS:
        return False
    raise error(f"{what} must be true or false, not {raw!r}")


def _type_name(annotation: object) -> str:
    # Under `from __future__ import annotations` a field's type is its source text.
    return annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")

"""Reading a request's `x` fields with clear errors for a missing or mistyped one."""
from __future__ import annotations

from typing import Any

from ferry.codec.limits import MAX_QUEUE_ID
from ferry.errors import MalformedRequestError
from ferry.names import validate_group, validate_topic
from ferry.store.histories import MAX_HISTORY_ID_CHARS

MAX_OFFSET = 2**63 - 1
_MISSING = object()


def int_field(fields: dict[str, Any], name: str, low: int, high: int,
              default: int | None = None) -> int:
    """An integer field within [low, high]; `default` when absent or null (if given)."""
    value = fields.get(name, _MISSING)
    if value is _MISSING or value is None:
        if default is not None:
            return default
        raise MalformedRequestError(f"field {name!r} is required")
    if type(value) is not int:
        raise MalformedRequestError(f"field {name!r} must be an integer, not {value!r}")
    if not low <= value <= high:
        raise MalformedRequestError(f"field {name!r} must be within {low}..{high}, not {value}")
    return value


def str_field(fields: dict[str, Any], name: str, max_len: int = 1024,
              default: str | None = None) -> str:
    """A string field of at most `max_len` characters."""
    value = fields.get(name)
    if value is None:
        if default is not None:
            return default
        raise MalformedRequestError(f"field {name!r} is required")
    if type(value) is not str:
        raise MalformedRequestError(f"field {name!r} must be a string, not {value!r}")
    if len(value) > max_len:
        raise MalformedRequestError(f"field {name!r} is longer than {max_len} characters")
    return value


def flag_field(fields: dict[str, Any], name: str) -> bool:
    """An optional boolean field, False when absent."""
    value = fields.get(name, False)
    if type(value) is not bool:
        raise MalformedRequestError(f"field {name!r} must be true or false, not {value!r}")
    return value


def hist_field(fields: dict[str, Any]) -> str | None:
    """The optional `hist` field: a queue history id (issue 16), None when absent."""
    value = fields.get("hist")
    if value is None:
        return None
    if type(value) is not str or not 0 < len(value) <= MAX_HISTORY_ID_CHARS:
        raise MalformedRequestError(f"field 'hist' must be a history id of 1..."
                                    f"{MAX_HISTORY_ID_CHARS} characters, not {value!r}")
    return value


def topic_field(fields: dict[str, Any]) -> str:
    """The `topic` field, checked by the naming rules (internal `%...%` topics allowed)."""
    return validate_topic(fields.get("topic"), allow_internal=True)


def group_field(fields: dict[str, Any]) -> str:
    return validate_group(fields.get("group"))


def queue_field(fields: dict[str, Any]) -> int:
    return int_field(fields, "queue_id", 0, MAX_QUEUE_ID)


def position_fields(fields: dict[str, Any]) -> tuple[str, str, int]:
    """(group, topic, queue_id): whose position in which queue a request is about."""
    return group_field(fields), topic_field(fields), queue_field(fields)


def offset_field(fields: dict[str, Any], name: str = "offset") -> int:
    """A queue offset (or, with `name`, a timestamp): 0 up to the largest int64."""
    return int_field(fields, name, 0, MAX_OFFSET)

"""The naming rules for topics and groups, shared by every layer.

A leaf module (it imports only `ferry.errors`). User names match
`[A-Za-z0-9_-]{1,127}`. `%` is reserved for internal topics, which are built
only by Ferry itself: `%RETRY%<group>`, `%DLQ%<group>`, `%SCHEDULE%` (delayed
messages), `%HALF%` and `%OP%` (transactions), `%TRACE%` (spans) and the
`%SYS%...` topics.
"""
from __future__ import annotations

import re

from ferry.errors import InvalidNameError

MAX_NAME_LENGTH = 127
_USER_NAME = re.compile(r"[A-Za-z0-9_-]{1,127}")
_INTERNAL_NAME = re.compile(r"%(RETRY|DLQ|SYS)%[A-Za-z0-9_-]{1,127}|%(SCHEDULE|HALF|OP|TRACE)%")

RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
SYSTEM_PREFIX = "%SYS%"
SCHEDULE_TOPIC = "%SCHEDULE%"   # delayed messages and retry back-off, read by the delay scheduler
HALF_TOPIC = "%HALF%"           # transactional half messages
OP_TOPIC = "%OP%"               # transaction commit/rollback records
TRACE_TOPIC = "%TRACE%"         # spans (JSON), keyed by message id and t:<trace id>


def validate_topic(name: object, *, allow_internal: bool = False) -> str:
    """Return `name` if it is a valid topic name, else raise InvalidNameError."""
    if isinstance(name, str):
        if _USER_NAME.fullmatch(name):
            return name
        if allow_internal and _INTERNAL_NAME.fullmatch(name):
            return name
    raise InvalidNameError(
        f"invalid topic name {name!r}: topics match [A-Za-z0-9_-]{{1,{MAX_NAME_LENGTH}}}"
        + ("" if allow_internal else " ('%' is reserved for internal topics)")
    )


def validate_group(name: object) -> str:
    """Return `name` if it is a valid group name, else raise InvalidNameError."""
    if isinstance(name, str) and _USER_NAME.fullmatch(name):
        return name
    raise InvalidNameError(
        f"invalid group name {name!r}: groups match [A-Za-z0-9_-]{{1,{MAX_NAME_LENGTH}}}"
    )


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + validate_group(group)


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + validate_group(group)


def is_internal(topic: str) -> bool:
    return topic.startswith("%")


def is_retry_topic(topic: str) -> bool:
    return topic.startswith(RETRY_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    return topic.startswith(DLQ_PREFIX)


class Perm:
    """What a `perm` string ("rw", "r", "w") allows: mixed into the values that carry one
    (a topic's config, a broker's share of a route)."""

    __slots__ = ()
    perm: str

    @property
    def readable(self) -> bool:
        return "r" in self.perm

    @property
    def writable(self) -> bool:
        return "w" in self.perm

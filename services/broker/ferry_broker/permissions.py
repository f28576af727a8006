"""What each wire request needs to be allowed: the request code -> permission table.

A request is allowed when ALL the needs of ANY ONE of its code's alternatives
are granted by its identity's rules (ferry.auth.acl). A need is read from the
request's own fields (the topic or group it names), so the check runs before
the handler does any work. docs/security.md has this table in words.

Reading a group's retry topic (`%RETRY%<group>`) is consuming as that group:
it needs `consume` on the group, not a grant on the internal topic.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ferry.auth.acl import ADMIN, Acl, group_resource, topic_resource
from ferry.errors import AccessDeniedError
from ferry.names import RETRY_PREFIX
from ferry.service.auth import RouteTable, admin
from ferry.wire import Frame, RequestCode

from ferry_broker.handlers.fields import group_field, topic_field

#: (action, resource) one request needs, read from its fields.
Need = Callable[[dict[str, Any]], tuple[str, str]]
#: Alternatives, each a tuple of needs that must all be granted.
Alternatives = tuple[tuple[Need, ...], ...]


def _pub(fields: dict[str, Any]) -> tuple[str, str]:
    return "pub", topic_resource(topic_field(fields))


def _sub(fields: dict[str, Any]) -> tuple[str, str]:
    topic = topic_field(fields)
    if topic.startswith(RETRY_PREFIX):
        return "consume", group_resource(topic[len(RETRY_PREFIX):])
    return "sub", topic_resource(topic)


def _consume(fields: dict[str, Any]) -> tuple[str, str]:
    return "consume", group_resource(group_field(fields))


def _reset(fields: dict[str, Any]) -> tuple[str, str]:
    return "reset", group_resource(group_field(fields))


def _commit(fields: dict[str, Any]) -> tuple[str, str]:
    """A member's commit is consuming; an operator's reset (`reset: true`, which moves
    the live members too) needs `reset` whoever sends it."""
    return ("reset" if fields.get("reset") is True else "consume"), \
        group_resource(group_field(fields))


def _admin(area: str) -> Need:
    def need(fields: dict[str, Any]) -> tuple[str, str]:
        return area, ADMIN
    need.__name__ = f"admin_{area}"
    return need


_READ = (_admin("read"),)

#: Every request code the broker serves; tests/broker hold it equal to the handler table.
PERMISSIONS: dict[int, Alternatives] = {
    RequestCode.SEND: ((_pub,),),
    RequestCode.PULL: ((_sub, _consume), _READ),
    # The group's own progress (consume), or an operator moving it (reset; a commit
    # flagged `reset`, which live members must follow, always needs reset).
    RequestCode.COMMIT_OFFSET: ((_commit,), (_reset,)),
    RequestCode.QUERY_OFFSET: ((_consume,), (_reset,), _READ),
    RequestCode.GET_MIN_MAX: ((_sub,), _READ),
    RequestCode.OFFSET_FOR_TIME: ((_sub,), _READ),
    RequestCode.QUERY_BY_ID: (_READ,),   # names no topic: an operator's query
    RequestCode.QUERY_BY_KEY: ((_sub,), _READ),
    # Membership, locks and nacks act as a group. A transactional producer's
    # group (HEARTBEAT role producer, END_TRANSACTION) is a group resource too.
    RequestCode.HEARTBEAT: ((_consume,),),
    RequestCode.UNREGISTER: ((_consume,),),
    RequestCode.GET_CONSUMERS: ((_consume,), (_reset,), _READ),
    RequestCode.LOCK: ((_consume,),),
    RequestCode.UNLOCK: ((_consume,),),
    # A nack names a stored message of the topic: reading it as the group (handlers/send_back).
    RequestCode.SEND_BACK: ((_sub, _consume), (_admin("dlq"),)),
    RequestCode.DELIVER_DUE: ((_admin("delay"),),),
    RequestCode.END_TRANSACTION: ((_consume,), (_admin("txn"),)),
    RequestCode.CHECK_TRANSACTION: ((_admin("txn"),),),
}


#: Codes answered without a signature: IDENTIFY tells a client what to sign for
#: (handlers/identify.py), so it cannot itself be signed.
OPEN_CODES = frozenset({RequestCode.IDENTIFY})


#: The broker's HTTP routes with auth on (ferry.auth.http); probes and OpenAPI stay open.
HTTP_ROUTES: RouteTable = {
    ("GET", "/v1/stats"): (admin("read"),),
    ("GET", "/metrics"): (admin("read"),),
}


def check_permission(acl: Acl, access_key: str, frame: Frame) -> None:
    """Raise AccessDeniedError unless `access_key` may make this request.

    A code missing from the table is left to the dispatcher (UnknownCodeError);
    a missing or invalid name field raises its own error (MalformedRequestError,
    InvalidNameError) here, as the handler would.
    """
    alternatives = PERMISSIONS.get(frame.code)
    if alternatives is None:
        return
    fields = frame.fields
    first_missing: tuple[str, str] | None = None
    for needs in alternatives:
        missing = next((n for n in (need(fields) for need in needs)
                        if not acl.allows(access_key, *n)), None)
        if missing is None:
            return
        first_missing = first_missing or missing
    assert first_missing is not None
    action, resource = first_missing
    code = RequestCode(frame.code).name
    raise AccessDeniedError(f"access denied: {access_key!r} may not {action!r} on "
                            f"{resource!r} ({code})")

"""Client membership: heartbeats, unregistering, and the live members of a group.

A HEARTBEAT with `role` "producer" registers a transactional producer (on the
connection it came on, which then receives its checks: see `producers`);
without a role, or with "consumer", a consumer, with its `subscriptions`
(topic -> tags and sql) when it sends them: each is compiled (so checked,
`InvalidFilterError` for a bad one) through the broker's filter cache, which
its pulls then hit; and with its start time `joined_ms`, which GET_CONSUMERS
reports with the members (their join order). A member leaving drops its queue
locks.
"""
from __future__ import annotations

from collections.abc import Mapping

from ferry.errors import BusyError, MalformedRequestError
from ferry.names import validate_topic
from ferry.wire import Frame, response

from ferry_broker.context import BrokerContext, ConnInfo
from ferry_broker.filters import FilterCache
from ferry_broker.handlers.fields import group_field, int_field, str_field
from ferry_broker.subscription_conflicts import SubFields
from ferry_broker.topic_types import check_member

MAX_CLIENT_ID_CHARS = 255
#: Upper bound of a HEARTBEAT's `joined_ms` (epoch ms; far beyond any real clock).
MAX_JOINED_MS = 2**62
MAX_SUBSCRIBED_TOPICS = 1024
MODES = ("clustering", "broadcasting")
ROLES = ("consumer", "producer")
SUBSCRIPTION_KEYS = frozenset({"tags", "sql"})


def _topics(value: object) -> frozenset[str]:
    if value is None:
        return frozenset()
    if not isinstance(value, list) or len(value) > MAX_SUBSCRIBED_TOPICS:
        raise MalformedRequestError(f"field 'topics' must be a list of at most "
                                    f"{MAX_SUBSCRIBED_TOPICS} topic names")
    return frozenset(validate_topic(t, allow_internal=True) for t in value)


def _subscriptions(value: object, filters: FilterCache) -> Mapping[str, SubFields] | None:
    """The `subscriptions` field checked and normalized; None when not sent."""
    if value is None:
        return None
    if not isinstance(value, dict) or len(value) > MAX_SUBSCRIBED_TOPICS:
        raise MalformedRequestError(f"field 'subscriptions' must be a map of at most "
                                    f"{MAX_SUBSCRIBED_TOPICS} topics to {{tags, sql}}")
    out: dict[str, SubFields] = {}
    for topic, sub in value.items():
        topic = validate_topic(topic, allow_internal=True)
        if sub is None:
            sub = {}
        if not isinstance(sub, dict) or not sub.keys() <= SUBSCRIPTION_KEYS:
            raise MalformedRequestError(f"subscription of topic {topic!r} must be a map with "
                                        f"'tags' and 'sql' (either nil), not {sub!r:.200}")
        got = filters.get(sub.get("tags"), sub.get("sql")).subscription
        out[topic] = (None if got.tags is None else tuple(sorted(got.tags)),
                      None if got.sql is None else got.sql.expression)
    return out


def _role(fields: dict[str, object]) -> str:
    role = str_field(fields, "role", 32, "consumer")
    if role not in ROLES:
        raise MalformedRequestError(f"field 'role' must be one of {', '.join(ROLES)} or nil")
    return role


async def handle_heartbeat(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    client_id = str_field(f, "client_id", MAX_CLIENT_ID_CHARS)
    if not client_id:
        raise MalformedRequestError("field 'client_id' must not be empty")
    group = group_field(f)
    if _role(f) == "producer":  # topics and mode mean nothing for a producer
        access_key = ctx.auth.identity(req) if ctx.auth is not None else ""
        if not ctx.producers.heartbeat(client_id, group, conn.conn_id, conn.push, access_key):
            raise BusyError("too many producers or producer groups on this broker")
        return response(req)
    mode = str_field(f, "mode", 32, "clustering")
    if mode not in MODES:
        raise MalformedRequestError(f"field 'mode' must be one of {', '.join(MODES)}")
    config = ctx.topics.configured_group(group)
    check_member(group, mode, config.broadcast_allowed if config is not None else True)
    subs = _subscriptions(f.get("subscriptions"), ctx.filters)
    joined_ms = int_field(f, "joined_ms", 0, MAX_JOINED_MS, 0)  # 0/absent: an old client
    if not ctx.consumers.heartbeat(client_id, group, _topics(f.get("topics")), mode, subs,
                                   joined_ms):
        raise BusyError("too many consumers or groups on this broker")
    return response(req)


async def handle_unregister(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    client_id, group = str_field(f, "client_id", MAX_CLIENT_ID_CHARS), group_field(f)
    if _role(f) == "producer":
        ctx.producers.unregister(client_id, group)
    else:
        ctx.consumers.unregister(client_id, group)  # drops its locks (on_leave) if a member
        ctx.locks.drop_client(group, client_id)  # and if it locked without heart-beating
    return response(req)


async def handle_get_consumers(ctx: BrokerContext, conn: ConnInfo, req: Frame) -> Frame:
    f = req.fields
    group = group_field(f)
    topic = f.get("topic")
    if topic is not None:
        topic = validate_topic(topic, allow_internal=True)
    infos = ctx.consumers.member_infos(group, topic)
    return response(req, {"members": [i.client_id for i in infos],
                          "joined_ms": [i.joined_ms for i in infos]})

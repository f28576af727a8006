"""Members of one group that subscribe differently to one topic: found, logged, listed.

Every member of a clustering group gets a share of a topic's queues and skips
what its own filter rejects, for good: messages that only another member's
filter would take are then lost to the group. RocketMQ leaves this to
operators; Ferry tells them. After each change of a group's membership or of a
member's subscriptions the broker compares its members' subscriptions per
topic; a topic where they differ is logged once per change (WARNING, naming
the group, the topic and each member's filter) and listed in `/v1/stats` under
`subscription_conflicts` until the members agree again (logged at INFO).

A member that sent no `subscriptions` field at all (a client from before
subscriptions were sent) is left out of the comparison: its filter is unknown.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

log = logging.getLogger(__name__)

#: One member's subscription to one topic, normalized: (sorted tags or None, sql or None).
SubFields = tuple[tuple[str, ...] | None, str | None]
TAKE_ALL: SubFields = (None, None)
#: Per topic, each member's subscription (client_id -> fields).
TopicConflicts = dict[str, dict[str, SubFields]]


def as_json(fields: SubFields) -> dict[str, Any]:
    """The wire/stats shape of one subscription: {"tags": [...] | None, "sql": str | None}."""
    tags, sql = fields
    return {"tags": None if tags is None else list(tags), "sql": sql}


def group_conflicts(members: Mapping[str, tuple[frozenset[str], Mapping[str, SubFields] | None]]
                    ) -> TopicConflicts:
    """The topics whose members (client_id -> (topics, subscriptions)) subscribe differently."""
    by_topic: dict[str, dict[str, SubFields]] = {}
    for client_id, (topics, subs) in members.items():
        if subs is None:  # unknown filter: not compared
            continue
        for topic in topics | subs.keys():
            by_topic.setdefault(topic, {})[client_id] = subs.get(topic, TAKE_ALL)
    return {topic: subs for topic, subs in sorted(by_topic.items())
            if len(set(subs.values())) > 1}


class ConflictTracker:
    """The current conflicts of every group, with a log line each time one changes."""

    def __init__(self) -> None:
        self._conflicts: dict[str, TopicConflicts] = {}

    def update(self, group: str, conflicts: TopicConflicts) -> None:
        """Record `group`'s conflicts now; log the topics whose conflict is new or changed."""
        before = self._conflicts.get(group, {})
        for topic, subs in conflicts.items():
            if before.get(topic) != subs:
                log.warning("consumer group %s subscribes differently to topic %s: %s; each "
                            "member skips what its own filter rejects, so messages only "
                            "another member's filter takes are lost to the group",
                            group, topic, _describe(subs),
                            extra={"group": group, "topic": topic, "members": sorted(subs)})
        for topic in before.keys() - conflicts.keys():
            log.info("consumer group %s agrees again on its subscription to topic %s",
                     group, topic, extra={"group": group, "topic": topic})
        if conflicts:
            self._conflicts[group] = conflicts
        else:
            self._conflicts.pop(group, None)

    def as_json(self) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
        """{group: {topic: {client_id: {"tags": ..., "sql": ...}}}} for /v1/stats."""
        return {group: {topic: {cid: as_json(f) for cid, f in sorted(subs.items())}
                        for topic, subs in topics.items()}
                for group, topics in sorted(self._conflicts.items())}


def _describe(subs: Mapping[str, SubFields]) -> str:
    parts = []
    for client_id, (tags, sql) in sorted(subs.items()):
        what = []
        if tags is not None:
            what.append("tags " + " || ".join(tags))
        if sql is not None:
            what.append(f"sql {sql!r}")
        parts.append(f"{client_id} takes {' and '.join(what) or 'everything'}")
    return "; ".join(parts)

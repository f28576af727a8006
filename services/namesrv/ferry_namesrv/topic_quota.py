"""How many topics namesrv creates on first use (`GET /v1/routes/{topic}?create=1`).

Every topic lands in etcd and in each broker's registration (issue 24), so
creation on first use is bounded: at most `max_topics` topics in etcd in all
(configured by operators or created here), and at most
`max_topics_per_identity` created by this namesrv instance for one identity
(auth on) since it started. Past either, BusyError names the limit. Topics
created through `POST /v1/topics` (admin `topics`) are not limited here, but
count toward `max_topics`.
"""
from __future__ import annotations

from ferry.errors import BusyError


class TopicQuota:
    """Counts the topics created on first use per identity; refuses past the limits."""

    def __init__(self, max_topics: int, max_topics_per_identity: int) -> None:
        self.max_topics = max_topics
        self.max_topics_per_identity = max_topics_per_identity
        self._created_by: dict[str, int] = {}

    def reserve(self, topic: str, identity: str | None, topics_now: int) -> None:
        """Count one topic about to be created for `identity`; BusyError past a limit."""
        if topics_now >= self.max_topics:
            raise BusyError(f"topic {topic!r} not created: {topics_now} topics exist, the "
                            f"limit (MAX_TOPICS)")
        if identity:
            created = self._created_by.get(identity, 0)
            if created >= self.max_topics_per_identity:
                raise BusyError(f"topic {topic!r} not created: {identity!r} has created "
                                f"{created} topics, its limit (MAX_TOPICS_PER_IDENTITY)")
            self._created_by[identity] = created + 1

    def release(self, identity: str | None) -> None:
        """Undo a reservation whose topic was not created (someone else's write won)."""
        if identity and self._created_by.get(identity, 0) > 0:
            self._created_by[identity] -= 1

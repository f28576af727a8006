"""What a consumer takes from its group's namesrv config: where new queues start, and retries.

Read at start (`GET /v1/groups/{group}`) and again before the first queue
starts if namesrv could not be reached then. New queues start where
`consume_from` says unless the consumer was given `auto_offset_reset`; a
group with no config starts at the latest offset; "timestamp" starts at
`consume_timestamp_ms`. The group's retry policy (`retry_max`,
`retry_backoff_ms`) goes to the consumer's `Nacker`, whose own options win.
A group's retry queues always start at their earliest offset (RocketMQ does
the same): retries stored before a member first read them are not skipped.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable

from ferry.client.consuming.retry import Nacker
from ferry.client.core.message import TopicQueue
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import FerryError, GroupNotFoundError
from ferry.names import is_retry_topic

log = logging.getLogger(__name__)

RESETS = ("latest", "earliest")
_STARTS = (*RESETS, "timestamp")


class GroupSettings:
    """A consumer group's start position rule and retry policy, as namesrv holds them."""

    def __init__(self, namesrv: NamesrvClient, group: str, auto_offset_reset: str | None,
                 nacker: Nacker) -> None:
        self.namesrv = namesrv
        self.group = group
        self.auto_offset_reset = auto_offset_reset   # None until read, unless given
        self.reset_given = auto_offset_reset is not None
        self.reset_ts_ms = 0
        self.created_ms = 0   # when namesrv first stored the group (0: no config, unknown)
        self.nacker = nacker

    async def load(self) -> None:
        """Read the group's config (a missing group has the defaults)."""
        try:
            config = await self.namesrv.call("GET", f"/v1/groups/{self.group}")
        except GroupNotFoundError:
            config = None
        config = config if isinstance(config, dict) else None
        self.nacker.configure(config)
        created = (config or {}).get("created_ms")
        self.created_ms = created if type(created) is int else 0
        if self.reset_given:
            return
        start = (config or {}).get("consume_from", "latest")
        self.auto_offset_reset = start if start in _STARTS else "latest"
        self.reset_ts_ms = int((config or {}).get("consume_timestamp_ms") or 0)
        log.info("group %s starts new queues from %s", self.group, self.auto_offset_reset)

    async def load_retry_policy(self) -> None:
        """Read the group's config if its retry policy was not read yet (namesrv was away
        at start); namesrv still away: the options alone, asked again next time."""
        if not self.nacker.configured:
            with contextlib.suppress(FerryError):
                await self.load()

    async def start_offset(self, tq: TopicQueue,
                           bounds: Callable[[TopicQueue], Awaitable[tuple[int, int]]],
                           offset_for_time: Callable[[TopicQueue, int], Awaitable[int]],
                           *, lost: bool = False) -> int:
        """Where `tq` starts when the group has no committed offset on it.

        `lost`: the broker's offset table is younger than the group, so every record
        of the queue was stored after the group last saw it: "latest" is then the
        queue's oldest offset, as "earliest" (issue 16)."""
        if self.auto_offset_reset is None:
            await self.load()
        low, high = await bounds(tq)
        if is_retry_topic(tq.topic):
            return low
        if self.auto_offset_reset == "timestamp":
            return await offset_for_time(tq, self.reset_ts_ms)
        return low if self.auto_offset_reset == "earliest" or lost else high

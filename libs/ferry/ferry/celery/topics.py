"""The admin side of the `ferry://` transport: a queue's topic and its group, on namesrv.

Coroutines the transport runs on its loop (`loop.LoopThread.run`): checking
that namesrv answers, creating a queue's topic when missing, asking whether it
exists, how far its group lags, purging (moving the group past what is
stored) and deleting an auto-delete queue's topic. No kombu import.
"""
from __future__ import annotations

import contextlib
import logging

from ferry.client import Admin
from ferry.client.admin.offset_reset import ResetSpec, ResetTo
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import AlreadyExistsError, TopicNotFoundError

log = logging.getLogger(__name__)


async def check_namesrv(addrs: str) -> None:
    """Fail with ConnectionLostError unless a namesrv answers (kombu then retries)."""
    client = NamesrvClient(addrs)
    await client.start()
    try:
        await client.call("GET", "/v1/brokers")
    finally:
        await client.close()


async def ensure_topic(namesrv: str, topic: str, queues: int, priority_levels: int = 1) -> None:
    """Create `topic` with `queues` queues per broker unless it exists (an existing
    topic keeps its queues and priority levels)."""
    async with Admin(namesrv=namesrv) as admin:
        with contextlib.suppress(AlreadyExistsError):
            await admin.create_topic(topic, queues=queues,
                                     priority_levels=min(priority_levels, queues))


async def topic_exists(namesrv: str, topic: str) -> bool:
    async with Admin(namesrv=namesrv) as admin:
        try:
            await admin.describe_topic(topic)
        except TopicNotFoundError:
            return False
        return True


async def group_lag(namesrv: str, group: str, topic: str) -> int:
    """Messages of `topic` that `group` has not committed yet."""
    async with Admin(namesrv=namesrv) as admin:
        return sum(q.lag for q in await admin.group_lag(group, [topic]))


async def purge(namesrv: str, group: str, topic: str) -> int:
    """Move `group` past every message stored in `topic` (`ferry group reset-offsets
    --to-latest --force`); returns how many it skipped.

    Live members are told to move (their next PULL answers OFFSET_RESET); records they
    hold already are not taken back, nor are redeliveries in the group's retry topic
    (as RabbitMQ keeps unacknowledged messages). Messages waiting in the delay
    scheduler (an eta) are not stored in the topic yet: they come later. Needs
    `reset` on the group."""
    async with Admin(namesrv=namesrv) as admin:
        try:
            plan = await admin.reset_offsets(group, topic, ResetSpec(ResetTo.LATEST), force=True)
        except TopicNotFoundError:
            return 0   # never created: nothing stored
    return sum(max(q.after - max(q.before, 0), 0) for q in plan.queues)


async def delete_if_unused(namesrv: str, group: str, topic: str) -> bool:
    """Delete `topic` unless `group` still has a live member on it (an auto-delete
    queue's last consumer left); True if deleted. Needs `admin` rights with auth on."""
    async with Admin(namesrv=namesrv) as admin:
        try:
            members = await admin.group_members(group, topic)
            if members:
                return False
            await admin.delete_topic(topic)
        except TopicNotFoundError:
            return False
    log.info("ferry://: deleted the topic %s of an auto-delete queue: its last consumer left",
             topic)
    return True

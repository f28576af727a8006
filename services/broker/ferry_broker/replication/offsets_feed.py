"""The master's sending of the committed-offset table to one slave: OFFSETS frames.

On a new link the whole table goes out in batches (a full resync: the slave may
have missed anything while unlinked); from then on, every interval, only the
entries changed since what this link was sent, and nothing when nothing changed.
The table hands over immutable entries on the event loop (`changes_since`: a
walk back over the changes, or one list for the whole table); they are encoded
in a worker thread, never on the loop, into payloads of at most CHUNK_BYTES each:
no batch is dropped or cut for its size (issue 24).
"""
from __future__ import annotations

import asyncio
import logging
from typing import Any, Protocol

from . import protocol as p

log = logging.getLogger(__name__)


class OffsetsFeed(Protocol):
    """The committed-offset table as a link sends it (ConsumerOffsetManager)."""

    @property
    def version(self) -> int:
        """Bumped by every change."""

    def changes_since(self, version: int) -> tuple[int, list[Any]]:
        """The current version and the entries changed after `version` (all for -1)."""

    def encode_changes(self, changes: list[Any], max_bytes: int) -> list[bytes]:
        """OFFSETS payloads for `changes`, each at most `max_bytes` (called in a thread)."""


async def feed_offsets(feed: OffsetsFeed, writer: asyncio.StreamWriter,
                       interval_ms: int) -> None:
    """Send the table, then its changes every `interval_ms`, until the link ends."""
    sent = -1  # the table version this link has; -1: nothing yet
    while True:
        if feed.version != sent:
            try:
                version, changes = feed.changes_since(sent)
                payloads = await asyncio.to_thread(feed.encode_changes, changes, p.CHUNK_BYTES)
            except Exception:  # a bug: said, and tried again next interval
                log.exception("replication: encoding the consumer offsets failed")
            else:
                for payload in payloads:
                    writer.writelines(p.frame(p.FrameType.OFFSETS, payload))
                    await writer.drain()
                sent = version
        await asyncio.sleep(interval_ms / 1000)

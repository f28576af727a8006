"""Periodic store housekeeping: retention of old commit-log segments.

The store deletes whole segments older than `retention_hours`, and the oldest
ones even if not expired while the disk is above `disk_high_water_ratio`;
consume queues and index files follow (see docs/store-format.md). The broker
runs it every `retention_check_interval_ms` on its event loop, where all store
writes happen: a run unlinks files and moves minimum offsets, which is quick.
"""
from __future__ import annotations

import asyncio
import logging

from ferry.errors import FerryError
from ferry.store import MessageStore

log = logging.getLogger(__name__)


def run_retention_once(store: MessageStore) -> None:
    """One retention pass; failures are logged, never raised (the broker keeps serving)."""
    try:
        report = store.run_retention()
    except (FerryError, OSError) as exc:
        log.warning("retention run failed: %s", exc, extra={"error": type(exc).__name__})
        return
    if report.deleted_segments:
        log.info("retention deleted %d commit-log segment(s)", report.deleted_segments,
                 extra={"freed_bytes": report.freed_bytes,
                        "forced_by_disk": report.forced_by_disk,
                        "new_min_phy_offset": report.new_min_phy_offset})


async def retention_loop(store: MessageStore, interval_ms: int) -> None:
    """Run retention every `interval_ms` until cancelled."""
    while True:
        await asyncio.sleep(interval_ms / 1000)
        run_retention_once(store)

"""Applying the retention policy (retention.py) to an open store's files."""
from __future__ import annotations

import logging
import os
import shutil
import time

from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queue import ConsumeQueues
from .index_file import IndexService
from .retention import RetentionReport, SegmentInfo, plan_retention

log = logging.getLogger(__name__)

__all__ = ["RetentionReport", "run_retention"]


def run_retention(config: StoreConfig, cl: CommitLog, cqs: ConsumeQueues, index: IndexService,
                  now_ms: int | None = None) -> RetentionReport:
    """Delete what the policy selects, then move queues and index past the new minimum.

    The caller holds the store lock. The active segment is never deleted.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    infos = [SegmentInfo(seg.path, seg.start_offset, seg.end_offset,
                         int(os.stat(seg.path).st_mtime * 1000)) for seg in cl.segments]
    if config.disk_usage_fn is not None:
        ratio, total = config.disk_usage_fn(config.root_dir), None
    else:
        usage = shutil.disk_usage(config.root_dir)
        ratio, total = usage.used / usage.total, usage.total
    plan = plan_retention(infos, now_ms=now, retention_ms=config.retention_ms,
                          disk_used_ratio=min(max(ratio, 0.0), 1.0),
                          high_water_ratio=config.disk_high_water_ratio, disk_total_bytes=total)
    if not plan.segments:
        return RetentionReport(0, cl.min_offset)
    deleted = cl.delete_segments({s.start_offset for s in plan.segments})
    new_min = cl.min_offset
    cq_deleted = cqs.delete_below_phy(new_min)
    index_deleted = index.delete_below_phy(new_min)
    report = RetentionReport(deleted, new_min, deleted * cl.segment_bytes, plan.forced_by_disk,
                             cq_deleted, index_deleted)
    log.info("retention: %s", report)
    return report

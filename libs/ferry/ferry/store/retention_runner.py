"""Applying the retention policy (retention.py) to an open store's files."""
from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Mapping

from .commit_log import CommitLog
from .config import StoreConfig
from .consume_queues import ConsumeQueues
from .index_file import IndexService
from .retention import RetentionFloor, RetentionReport, SegmentInfo, plan_retention
from .topic_retention import TopicRetention, segment_retention, trim_topics

log = logging.getLogger(__name__)

__all__ = ["RetentionReport", "floor_phy_offset", "run_retention"]


def floor_phy_offset(cqs: ConsumeQueues, floor: RetentionFloor, end: int) -> int:
    """The smallest phy offset `floor` protects; `end` (the log's end) when none.

    A queue position is looked up in its consume queue: the phy offset of the
    first entry not passed (a position below the queue's minimum counts from the
    minimum, what is gone is gone; one at or past its end protects nothing).
    """
    lowest = end if floor.phy_offset is None else min(end, floor.phy_offset)
    for (topic, queue_id), position in floor.queue_positions.items():
        cq = cqs.find(topic, queue_id)
        if cq is None:
            continue
        entry = cq.get(max(position, cq.min_offset), 1)
        if entry:
            lowest = min(lowest, entry[0][0])
    return lowest


def run_retention(config: StoreConfig, cl: CommitLog, cqs: ConsumeQueues, index: IndexService,
                  now_ms: int | None = None, floor: RetentionFloor | None = None,
                  topics: Mapping[str, TopicRetention] | None = None) -> RetentionReport:
    """Delete what the policy selects, then move queues and index past the new minimum.

    The caller holds the store lock. The active segment is never deleted. With
    `floor`, disk pressure deletes no segment holding a record the floor protects.
    With `topics` (per-topic retention, topic_retention.py), their queues are trimmed
    first and a segment expires by age at the longest retention still holding it.
    """
    now = int(time.time() * 1000) if now_ms is None else now_ms
    infos = [SegmentInfo(seg.path, seg.start_offset, seg.end_offset,
                         int(os.stat(seg.path).st_mtime * 1000)) for seg in cl.segments]
    if config.disk_usage_fn is not None:
        ratio, total = config.disk_usage_fn(config.root_dir), None
    else:
        usage = shutil.disk_usage(config.root_dir)
        ratio, total = usage.used / usage.total, usage.total
    trimmed, retention_of = 0, None
    if topics:
        trimmed = trim_topics(cqs, infos, now, topics)
        retention_of = segment_retention(cqs, topics, config.retention_ms)
    protected = None if floor is None else floor_phy_offset(cqs, floor, cl.write_offset)
    plan = plan_retention(infos, now_ms=now, retention_ms=config.retention_ms,
                          disk_used_ratio=min(max(ratio, 0.0), 1.0),
                          high_water_ratio=config.disk_high_water_ratio, disk_total_bytes=total,
                          protected_from=protected, retention_of=retention_of)
    if not plan.segments:
        return RetentionReport(0, cl.min_offset, deleted_queue_segments=trimmed,
                               held_by_floor=plan.held_by_floor)
    deleted = cl.delete_segments({s.start_offset for s in plan.segments})
    new_min = cl.min_offset
    cq_deleted = cqs.delete_below_phy(new_min)
    index_deleted = index.delete_below_phy(new_min)
    report = RetentionReport(deleted, new_min, deleted * cl.segment_bytes, plan.forced_by_disk,
                             trimmed + cq_deleted, index_deleted, plan.held_by_floor)
    log.info("retention: %s", report)
    return report

"""Reading queues without a consumer: the services' followers of internal topics and
the read-only range scans of the admin tools (docs/client.md, "Queue readers")."""
from __future__ import annotations

from ferry.client.reading.ranges import pull, read_range
from ferry.client.reading.reader import (
    Cursor,
    QueueReader,
    ReadConfig,
    ReadQueue,
    now_ms,
    route_or_none,
)

__all__ = [
    # following a route's queues
    "QueueReader",
    "ReadConfig",
    "ReadQueue",
    "Cursor",
    "route_or_none",
    "now_ms",
    # one PULL, a range
    "pull",
    "read_range",
]

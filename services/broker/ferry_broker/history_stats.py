"""Counts of the broker's answers about replaced queue histories (issue 16), for /v1/stats.

A PULL whose position is not in the continuation of what the broker stores is answered with the offset to go back to (handlers/pull.py);
each such answer is logged once per (group, queue, divergence offset) and
counted here.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Divergence events remembered to log each once (oldest forgotten first).
MAX_LOGGED_EVENTS = 10_000


@dataclass(slots=True)
class HistoryStats:
    """How often consumers were sent back because a queue's history was replaced."""

    diverged: int = 0          # PULLs answered HISTORY_DIVERGED
    overflow_rewound: int = 0  # history-less PULLs past the end sent to the newest history's start
    _seen: dict[tuple[str, str, int, int], None] = field(default_factory=dict)

    def event(self, kind: str, group: str, topic: str, queue_id: int, old: int, new: int,
              reason: str) -> None:
        """Count one answer; log it once per (group, queue, new offset)."""
        setattr(self, kind, getattr(self, kind) + 1)
        key = (group, topic, queue_id, new)
        if key in self._seen:
            return
        if len(self._seen) >= MAX_LOGGED_EVENTS:
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = None
        log.warning("group %s, queue %s/%d: offset %d -> %d (%s)", group, topic, queue_id, old,
                    new, reason)

    def as_dict(self) -> dict[str, int]:
        return {"diverged": self.diverged, "overflow_rewound": self.overflow_rewound}

"""Offset resets a group's live members have not picked up yet (issue 25).

An operator's reset (`ferry group reset-offsets`, a COMMIT_OFFSET with `reset`)
writes the committed offset; a member that holds the queue still has its own
position in memory and would commit it over the reset at its next commit.
Like RocketMQ's RESET_CONSUMER_CLIENT_OFFSET, the broker tells the member: it
remembers the reset here, answers the member's next PULL at another offset with
OFFSET_RESET (`next_offset` the reset position; the member drops what it
buffered and continues there) and ignores the member's commits meanwhile. A PULL
at the reset position clears the mark: from then on the member's commits are its
own again.

The marks survive a restart: each new mark rewrites `DATA_DIR/config/
pending_resets.json` (`save`, atomically, before the reset is answered), and
`load` at start takes back every mark whose queue's committed offset is still
the mark's (a member that picked a mark up and committed past it moved the
offset; while a mark is pending no member's commit moves it). A member that
kept running across the restart is then told at its next PULL, as before.
Clearing a mark does not rewrite the file: the committed-offset check at load
drops the marks that were picked up. A recovered mark waits a fresh
`PENDING_RESET_TTL_MS`. The file (version 1)::

    {"version": 1, "marks": [[group, topic, queue_id, offset], ...]}

Bounded: at most `MAX_PENDING_RESETS`, past that the oldest mark is dropped; and
for `PENDING_RESET_TTL_MS`, so that a member that never pulls from this broker
(it reads from a slave meanwhile) is not ignored for good.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ferry.atomic_file import load_versioned, replace_durably

from ferry_broker.offsets_codec import OffsetKey

log = logging.getLogger(__name__)

#: Marks kept at most (only identities with `reset` on a group create them).
MAX_PENDING_RESETS = 10_000
#: How long a mark waits for a member's PULL: well past a long poll and a rebalance.
PENDING_RESET_TTL_MS = 120_000
#: The version of the marks file.
FILE_VERSION = 1


class PendingResets:
    """(group, topic, queue_id) -> the offset an operator reset it to, until a member
    pulls from there."""

    def __init__(self, max_entries: int = MAX_PENDING_RESETS,
                 ttl_ms: int = PENDING_RESET_TTL_MS,
                 clock_ms: Callable[[], float] | None = None, path: Path | None = None) -> None:
        self._marks: dict[OffsetKey, tuple[int, float]] = {}   # -> (offset, expiry)
        self._max = max_entries
        self._ttl_ms = ttl_ms
        self._clock_ms = clock_ms or (lambda: time.monotonic() * 1000)
        self._path = path   # None: in memory only
        # Saves run in worker threads: one at a time, and the newest snapshot wins.
        self._save_lock = threading.Lock()
        self._version = self._saved_version = 0

    def __len__(self) -> int:
        return len(self._marks)

    def mark(self, key: OffsetKey, offset: int) -> None:
        self._version += 1
        self._marks.pop(key, None)
        self._marks[key] = (offset, self._clock_ms() + self._ttl_ms)
        while len(self._marks) > self._max:
            del self._marks[next(iter(self._marks))]

    def get(self, key: OffsetKey) -> int | None:
        """The reset position members have not picked up, None when there is none."""
        mark = self._marks.get(key)
        if mark is None:
            return None
        if mark[1] <= self._clock_ms():
            del self._marks[key]
            return None
        return mark[0]

    def redirect(self, key: OffsetKey, offset: int) -> int | None:
        """Where a member's PULL at `offset` must go instead (None: serve it). A PULL at
        the reset position itself clears the mark: the member has picked it up."""
        target = self.get(key)
        if target is not None and target == offset:
            del self._marks[key]
            return None
        return target

    # -- the file ---------------------------------------------------------------------------

    def snapshot(self) -> tuple[int, bytes]:
        """The marks' version and the file content of the marks pending now (on the loop)."""
        now = self._clock_ms()
        marks = [[g, t, q, offset] for (g, t, q), (offset, expiry) in self._marks.items()
                 if expiry > now]
        return self._version, json.dumps({"version": FILE_VERSION, "marks": marks},
                                         separators=(",", ":")).encode()

    def write_snapshot(self, version: int, content: bytes) -> None:
        """Write a snapshot atomically and durably; safe to call from a worker thread."""
        if self._path is None:
            return
        with self._save_lock:
            if version <= self._saved_version:
                return   # a newer snapshot is already on disk
            self._path.parent.mkdir(parents=True, exist_ok=True)
            replace_durably(self._path, content)
            self._saved_version = version

    def load(self, committed: Callable[[OffsetKey], int]) -> int:
        """Take back the marks of the file whose queue's committed offset (`committed`) is
        still the mark's; the number taken. No file: none. ValueError: not such a file."""
        if self._path is None:
            return 0
        doc = load_versioned(self._path, FILE_VERSION,
                             "remove it to forget the resets live members have not picked up")
        taken = 0
        for group, topic, queue_id, offset in (doc or {}).get("marks", []):
            key = (str(group), str(topic), int(queue_id))
            if committed(key) == int(offset):
                self.mark(key, int(offset))
                taken += 1
        if taken:
            log.info("%d pending offset reset(s) taken back from %s", taken, self._path)
        return taken

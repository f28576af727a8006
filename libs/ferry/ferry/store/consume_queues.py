"""ConsumeQueues: the registry of a store's consume queues, one per (topic, queue_id).

The store reaches a queue through it (`find`, `get_or_create` on dispatch) and runs
the operations that concern every queue at once through it: recovery's and
truncation's cut, retention's deletion, and the checkpoint's collection of the
files and directories to make durable. One queue's files are consume_queue.py.
"""
from __future__ import annotations

import os
from collections.abc import Iterator

from .consume_queue import MAX_MAPPED_SEGMENTS, ConsumeQueue
from .cq_segment import MappingLru

__all__ = ["ConsumeQueues"]


class ConsumeQueues:
    """Every consume queue under `<root_dir>/consumequeue`, loaded on open."""

    def __init__(self, root_dir: str, entries_per_segment: int = 300_000,
                 max_mapped_segments: int = MAX_MAPPED_SEGMENTS) -> None:
        self.root_dir = root_dir
        self.entries_per_segment = entries_per_segment
        self.lru = MappingLru(max_mapped_segments)
        self._new_dirs: set[str] = set()
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        # Size retention's running totals, per queue: (min offset, end, bytes in between),
        # so that a run reads only the entries added or dropped since the last one.
        self.kept_bytes: dict[tuple[str, int], tuple[int, int, int]] = {}
        base = os.path.join(root_dir, "consumequeue")
        os.makedirs(base, exist_ok=True)
        for topic in sorted(os.listdir(base)):
            topic_dir = os.path.join(base, topic)
            if not os.path.isdir(topic_dir):
                continue
            for qid in sorted(os.listdir(topic_dir)):
                if qid.isdigit() and os.path.isdir(os.path.join(topic_dir, qid)):
                    self.get_or_create(topic, int(qid))

    def get_or_create(self, topic: str, queue_id: int) -> ConsumeQueue:
        cq = self._queues.get((topic, queue_id))
        if cq is None:
            cq = ConsumeQueue(self.root_dir, topic, queue_id, self.entries_per_segment, self.lru,
                              self._new_dirs)
            self._queues[(topic, queue_id)] = cq
        return cq

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        return self._queues.get((topic, queue_id))

    def __iter__(self) -> Iterator[ConsumeQueue]:
        return iter(list(self._queues.values()))

    def __len__(self) -> int:
        return len(self._queues)

    def truncate_from_phy(self, phy_offset: int) -> None:
        """truncate_from_phy on every queue."""
        self.kept_bytes.clear()  # entries from the cut on will be new ones: count afresh
        for cq in self._queues.values():
            cq.truncate_from_phy(phy_offset)

    def delete_below_phy(self, min_phy: int) -> int:
        """delete_below_phy on every queue; returns the segment files deleted."""
        return sum(cq.delete_below_phy(min_phy) for cq in self._queues.values())

    def max_last_phy(self) -> int:
        """The highest phy offset any queue's newest entry points to (-1 when none)."""
        best = -1
        for cq in self._queues.values():
            last = cq.last_entry()
            if last is not None:
                phy, _size, _tag_hash = last
                best = max(best, phy)
        return best

    def flush(self) -> None:
        for cq in self._queues.values():
            cq.flush()

    def take_new_dirs(self) -> set[str]:
        """Directories that got new entries (queues, segments) since the last call.

        The checkpoint fsyncs them: a file's data is not durable until its name is.
        """
        # Every queue adds to this one set (given at creation): empty it in place.
        dirs = set(self._new_dirs)
        self._new_dirs.clear()
        return dirs

    def take_dirty(self) -> list[str]:
        """Paths of the segments written since the last call, now marked clean.

        The checkpoint fdatasyncs them by path outside the store lock: that persists
        the file's dirty mapped pages (like msync) but releases the GIL, and it does
        not matter whether the segment was unmapped meanwhile (its pages stay in the
        page cache until written back) or deleted by retention (nothing to keep).
        """
        out: list[str] = []
        for cq in self._queues.values():
            cq.take_dirty(out)
        return out

    def close(self) -> None:
        for cq in self._queues.values():
            cq.close()

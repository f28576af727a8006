"""Checkpointer: makes the consume queues and index durable and records how far.

The flush thread (flush.py) calls `checkpoint` every checkpoint_interval_ms;
MessageStore.close calls `final` for the last one, which alone may say "clean".
The file it writes is checkpoint.py's; what recovery does with it, recovery.py.
"""
from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable

from .checkpoint import Checkpoint, sync_files, write_checkpoint
from .commit_log import CommitLog
from .consume_queues import ConsumeQueues
from .dispatch import LiveDispatch
from .index_file import IndexService

log = logging.getLogger(__name__)


class Checkpointer:
    """The checkpoints of one open store, sharing the store's lock for what they read."""

    def __init__(self, root_dir: str, cl: CommitLog, cqs: ConsumeQueues, index: IndexService,
                 dispatcher: LiveDispatch, store_lock: threading.Lock,
                 dispatch: Callable[[], None], is_closed: Callable[[], bool]) -> None:
        self._root = root_dir
        self._cl = cl
        self._cqs = cqs
        self._index = index
        self._dispatcher = dispatcher
        self._store_lock = store_lock
        self._dispatch = dispatch
        self._is_closed = is_closed
        # Held by each checkpoint and by MessageStore.truncate_to, taken before the store
        # lock: a checkpoint computed before a truncation must not be written after it.
        self.lock = threading.Lock()
        # Files (and directories) a checkpoint could not sync yet; the next one does.
        self._unsynced: list[str] = []
        self._unsynced_dirs: set[str] = set()

    def mark_open(self) -> None:
        """Record an unclean checkpoint at the log's end: a crash from now on recovers."""
        write_checkpoint(self._root, Checkpoint(self._cl.flushed_offset, self._cl.write_offset,
                                                False))

    def checkpoint(self) -> None:
        """Checkpoint thread (flush.py): make queues and index durable, then record how far.

        Only the dispatch and the collection of dirty files run under the store
        lock; their fdatasyncs run outside it (an msync of a mapping holds the GIL
        for its whole call and would freeze the broker's event loop).
        """
        with self.lock:
            self._checkpoint_locked()

    def _checkpoint_locked(self) -> None:
        with self._store_lock:
            if self._is_closed():
                return
            self._dispatch()
            dispatched = self._dispatcher.dispatched_offset
            paths = self._unsynced + self._cqs.take_dirty() + self._index.take_dirty()
            dirs = self._unsynced_dirs | self._cqs.take_new_dirs() | self._index.take_new_dirs()
            self._unsynced, self._unsynced_dirs = [], set()
        try:
            sync_files(paths)
            sync_files(sorted(dirs), data_only=False)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            # Out of descriptors for a moment: not a dead disk. Keep the files for the
            # next checkpoint and skip this one (the last checkpoint stays valid).
            self._unsynced, self._unsynced_dirs = paths, dirs
            log.warning("checkpoint skipped: no file descriptor to sync with (%s)", exc)
            return
        flushed = self._cl.flush(dispatched)
        write_checkpoint(self._root, Checkpoint(flushed, dispatched, False))

    def final(self, clean: bool) -> None:
        """The shutdown checkpoint, under the store lock with the flush thread stopped:
        flush everything dispatched and record it, `clean` when nothing needs recovery.
        OSError leaves the last checkpoint (unclean) in place."""
        self._cqs.flush()
        self._index.flush()
        sync_files(sorted(self._cqs.take_new_dirs() | self._index.take_new_dirs()),
                   data_only=False)
        self._cl.flush()
        write_checkpoint(self._root, Checkpoint(self._cl.flushed_offset,
                                                self._dispatcher.dispatched_offset, clean))

"""The page warmer: keeps the commit log's page cache populated ahead of the writer.

The first write to a page of a freshly allocated segment costs the writer far
more than the copy itself: the kernel must find a free page and zero it (and, on
a virtual machine, the host must back it). Measured here, that first touch made
appends run at about 650 MB/s of kernel time while copying into an already cached
page runs at several GB/s. So a background thread asks the kernel to read the
next `ahead_bytes` of the active segment into the page cache (POSIX_FADV_WILLNEED;
the segment is preallocated, so this reads zeros without any disk I/O) while the
writer is still behind; the writer's pwrite then only copies. This is RocketMQ's
"warm mapped file" idea, done without dirtying the pages (no zeros are written
back to disk) and on another core (posix_fadvise releases the GIL).

Warming is only a hint: a failure is ignored, and a writer that outruns the
warmer pays the first touch itself, as without it. The thread opens segment
files by name, so it shares no file descriptor with the store (a segment deleted
under it is simply skipped).
"""
from __future__ import annotations

import logging
import os
import threading

from .mapped_file import segment_name

log = logging.getLogger(__name__)

# The writer wakes the warmer each time it has written this much more.
WARM_STEP_BYTES = 8 << 20


class PageWarmer:
    """Owns the warm-up thread of one commit log."""

    def __init__(self, commitlog_dir: str, segment_bytes: int, ahead_bytes: int,
                 write_offset: int) -> None:
        self._dir = commitlog_dir
        self._segment_bytes = segment_bytes
        self._ahead = ahead_bytes
        self._step = min(WARM_STEP_BYTES, max(1, ahead_bytes // 2))
        self._cond = threading.Condition(threading.Lock())
        self._written = write_offset
        self._target = write_offset + ahead_bytes
        # The writer calls wrote_to once it reaches this offset (checked inline).
        self.next_kick_offset = write_offset + self._step
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="ferry-store-warm", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wrote_to(self, write_offset: int) -> None:
        """The writer's new position (called after every append; cheap until a step is passed)."""
        if write_offset < self.next_kick_offset:
            return
        self.next_kick_offset = write_offset + self._step
        with self._cond:
            self._written = write_offset
            self._target = write_offset + self._ahead
            self._cond.notify()

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        done, handled = self._written, -1
        fd, fd_start = -1, -1
        try:
            while True:
                with self._cond:
                    # Each kick moves the target: wait for one (a segment that did not
                    # exist yet is retried at the next, never in a busy loop).
                    while not self._stopping and self._target == handled:
                        self._cond.wait()
                    if self._stopping:
                        return
                    done = max(done, self._written)  # never warm what is already written
                    target = handled = self._target
                while done < target:
                    start = done - done % self._segment_bytes
                    if start != fd_start:
                        if fd >= 0:
                            os.close(fd)
                            fd, fd_start = -1, -1
                        try:
                            fd = os.open(os.path.join(self._dir, segment_name(start)), os.O_RDONLY)
                        except OSError:
                            break  # not created yet (the next kick retries) or deleted
                        fd_start = start
                    stop = min(target, start + self._segment_bytes, done + self._step)
                    os.posix_fadvise(fd, done - start, stop - done, os.POSIX_FADV_WILLNEED)
                    done = stop
        except OSError as exc:
            log.warning("commit-log page warming stopped: %s", exc)
        finally:
            if fd >= 0:
                os.close(fd)

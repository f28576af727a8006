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

Zeroing (`zero=True`, the store's SYNC flush mode): a preallocated segment's
blocks are "unwritten extents", and the first fdatasync after a write into one
must also commit the extent's conversion to the file system journal. Measured
here (ext4), that made each group commit's fdatasync 2.5x slower (p50 0.85 vs
0.31 ms) than one over blocks already written. So in sync mode the warmer
writes zeros ahead of the writer, ZERO_STEP_BYTES at a time, and fdatasyncs
them (RocketMQ's warmed mapped files do the same): the group commits then only
write data. Zeros are what a preallocated segment reads as anyway, so the
on-disk format and recovery are unchanged. A zero write must never land on a
record: the warmer claims its range first (`_claim_lo`) and then re-reads how
far the writer has announced (`before_write`), the writer announces its end and
then reads the claim, so under the GIL at least one of them sees the other; the
warmer then backs off, or the writer waits for the claim to clear.
"""
from __future__ import annotations

import logging
import os
import threading

from ferry.errors import StoreError

from .mapped_file import segment_name

log = logging.getLogger(__name__)

# The writer wakes the warmer each time it has written this much more.
WARM_STEP_BYTES = 8 << 20
# Zeroing mode: zeros written (and fdatasync'd) per step; a writer that catches up
# with the warmer waits at most for one step.
ZERO_STEP_BYTES = 2 << 20
# Zeros go out in pwrites of this size: each holds the file's write lock, which the
# writer's own pwrite then waits for, so they are kept short.
ZERO_WRITE_BYTES = 256 << 10
# A writer never waits longer than this for a zeroing step (a stuck disk): it fails.
ZERO_WAIT_S = 10.0
_NO_CLAIM = 1 << 62
_ZEROS = memoryview(bytes(ZERO_WRITE_BYTES))


class PageWarmer:
    """Owns the warm-up thread of one commit log."""

    def __init__(self, commitlog_dir: str, segment_bytes: int, ahead_bytes: int,
                 write_offset: int, *, zero: bool = False) -> None:
        self._dir = commitlog_dir
        self._segment_bytes = segment_bytes
        self._ahead = ahead_bytes
        self._zero = zero
        self._step = min(ZERO_STEP_BYTES if zero else WARM_STEP_BYTES, max(1, ahead_bytes // 2))
        # Zeroing: the start of the range being zeroed (_NO_CLAIM: none), and the
        # highest commit-log offset the writer has announced it writes up to.
        self._claim_lo = _NO_CLAIM
        self._writer_end = write_offset
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

    def before_write(self, end: int) -> None:
        """The writer is about to write up to commit-log offset `end` (every append).

        Waits while the warmer zeroes a range below `end` (never in practice: it
        runs `ahead_bytes` ahead); StoreError after ZERO_WAIT_S."""
        if end > self._writer_end:
            self._writer_end = end  # announce first, then read the claim (see the module doc)
        if end > self._claim_lo:
            with self._cond:
                if not self._cond.wait_for(lambda: end <= self._claim_lo, ZERO_WAIT_S):
                    raise StoreError("the page warmer's zero write did not finish in "
                                     f"{ZERO_WAIT_S:g} s")

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
                    # never warm what is already written
                    done = max(done, self._written, self._writer_end)
                    target = handled = self._target
                while done < target:
                    start = done - done % self._segment_bytes
                    if start != fd_start:
                        if fd >= 0:
                            os.close(fd)
                            fd, fd_start = -1, -1
                        try:
                            fd = os.open(os.path.join(self._dir, segment_name(start)),
                                         os.O_RDWR if self._zero else os.O_RDONLY)
                        except OSError:
                            break  # not created yet (the next kick retries) or deleted
                        fd_start = start
                    stop = min(target, start + self._segment_bytes, done + self._step)
                    if self._zero:  # (returns past `done`: `stop`, or the writer's end)
                        done = self._zero_range(fd, start, done, stop)
                        continue
                    else:
                        os.posix_fadvise(fd, done - start, stop - done, os.POSIX_FADV_WILLNEED)
                    done = stop
        except OSError as exc:
            log.warning("commit-log page warming stopped: %s", exc)
        finally:
            if fd >= 0:
                os.close(fd)

    def _zero_range(self, fd: int, seg_start: int, lo: int, hi: int) -> int:
        """Write zeros over [lo, hi) of the segment at `seg_start` and fdatasync them,
        unless the writer has announced a write past `lo`; returns where zeroing may
        go on from (`hi` when done, the writer's end when it backed off)."""
        with self._cond:
            self._claim_lo = lo  # claim first, then read the writer's announcement
        try:
            if self._writer_end > lo:
                return self._writer_end
            at = lo
            while at < hi:
                n = os.pwrite(fd, _ZEROS[:min(hi - at, ZERO_WRITE_BYTES)], at - seg_start)
                if n <= 0:
                    raise OSError(f"pwrite of zeros wrote nothing at {at}")
                at += n
            os.fdatasync(fd)
            return hi
        finally:
            with self._cond:
                self._claim_lo = _NO_CLAIM
                self._cond.notify_all()

"""One commit-log segment: a preallocated file, memory-mapped for writes and reads.

Segments are created at full size with posix_fallocate (zeros, blocks reserved)
so that an append can never hit ENOSPC halfway through a record. A zero
`total_size` marks where data ends. The appender writes each batch with one
`pwrite` (`write`); readers get read-only memoryview slices of the mapping (zero
copy), which shares the page cache with the file, so they see every write.

A read through the mapping of a page that is not in the page cache blocks the
reading thread on the disk (a major fault), so a server can ask first:
`resident` probes a range without blocking (a one-byte `preadv` with
RWF_NOWAIT per probe step), and `load_span` reads a range into the page cache
from another thread, through its own file descriptor (see reader.py).
"""
from __future__ import annotations

import errno
import mmap
import os

from ferry.errors import StoreError

# Writes up to this size are copied into the mapping instead of pwrite (see write).
SMALL_WRITE_BYTES = 4096
# `resident` probes one byte every this many bytes: the kernel's readahead fills the
# page cache in runs of at least this size, so a gap between probes is unlikely.
PROBE_STEP_BYTES = 64 << 10
# `load_span` reads in chunks of this size (one buffer, reused).
LOAD_CHUNK_BYTES = 1 << 20
# ...and asks the kernel to read this much past the span in the background
# (POSIX_FADV_WILLNEED): a reader far behind reads on sequentially, so its next
# pulls find their pages cached (or on their way) instead of each waiting for a
# small read of its own (the file is opened afresh each time, without readahead state).
LOAD_AHEAD_BYTES = 4 << 20
_NOWAIT = getattr(os, "RWF_NOWAIT", 0)


def segment_name(start_offset: int) -> str:
    """File name of the segment starting at commit-log byte `start_offset`."""
    return f"{start_offset:020d}"


class MappedFile:
    """A fixed-size segment file mapped read-write; positions are relative to its start."""

    def __init__(self, path: str, start_offset: int, size: int, *, create: bool) -> None:
        self.path = path
        self.start_offset = start_offset
        self.size = size
        try:
            self.fd = _create(path, size) if create else os.open(path, os.O_RDWR)
        except OSError as exc:
            raise StoreError(f"cannot open commit-log segment {path}: {exc}") from exc
        try:
            if not create and os.fstat(self.fd).st_size != size:
                raise StoreError(
                    f"commit-log segment {path} has size {os.fstat(self.fd).st_size}, expected {size}")
            self.mm = mmap.mmap(self.fd, size)
        except BaseException:
            os.close(self.fd)
            raise
        self.view = memoryview(self.mm)  # writable: the encoder packs records in place
        self.read_view = self.view.toreadonly()

    @property
    def end_offset(self) -> int:
        return self.start_offset + self.size

    def zero_from(self, rel: int) -> None:
        """Discard everything from `rel` to the end (recovery of a torn tail).

        Shrinking then re-growing the file makes the kernel drop those pages,
        which is far cheaper than writing zeros over a mostly-empty segment.
        """
        self._unmap()
        os.ftruncate(self.fd, rel)
        _preallocate(self.fd, self.size)
        os.fsync(self.fd)
        self.mm = mmap.mmap(self.fd, self.size)
        self.view = memoryview(self.mm)
        self.read_view = self.view.toreadonly()

    def write(self, data: memoryview, rel: int) -> None:
        """Write `data` at `rel`: with pwrite, or a copy into the mapping when it is small.

        Why pwrite: the first store to each page of a mapping takes a page fault
        (and a fresh page is zero-filled before the copy overwrites it), while
        pwrite fills whole pages of the page cache directly, so a large batch costs
        far less kernel time. Below one page the system call is the larger cost
        (sync mode appends one small record per request), so those are copied.
        """
        total = len(data)
        if total <= SMALL_WRITE_BYTES:
            self.mm[rel:rel + total] = data
            return
        fd, done = self.fd, 0
        while done < total:
            n = os.pwrite(fd, data[done:] if done else data, rel + done)
            if n <= 0:
                raise StoreError(f"pwrite to {self.path} wrote nothing at {rel + done}")
            done += n

    def flush(self) -> None:
        os.fdatasync(self.fd)

    def resident(self, rel: int, length: int) -> bool:
        """Whether [rel, rel + length) is in the page cache (probed every
        PROBE_STEP_BYTES and at its last byte), without ever blocking on the disk.
        Where the probe is not supported, everything counts as resident (reads
        then behave as before: through the mapping)."""
        if not _NOWAIT or length <= 0:
            return True
        probe = bytearray(1)
        last = rel + length - 1
        at = rel
        while True:
            try:
                os.preadv(self.fd, [probe], min(at, last), _NOWAIT)
            except BlockingIOError:
                return False
            except OSError:
                return True
            if at >= last:
                return True
            at += PROBE_STEP_BYTES

    def _unmap(self) -> None:
        self.read_view.release()
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            # A reader still holds a slice: the mapping goes away when it drops it.
            pass

    def close(self) -> None:
        self._unmap()
        os.close(self.fd)

    def delete(self) -> None:
        self.close()
        os.unlink(self.path)


def load_span(path: str, rel: int, length: int) -> None:
    """Read [rel, rel + length) of the segment file at `path` into the page cache.

    Blocks on the disk: meant for a thread other than the one serving requests.
    It opens the file by name, so it shares nothing with the store: a segment
    deleted meanwhile (retention) is skipped, and a failure is only a lost hint."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        end = rel + length
        buf = bytearray(min(length, LOAD_CHUNK_BYTES))
        while rel < end:
            view = memoryview(buf)[:min(len(buf), end - rel)]
            n = os.preadv(fd, [view], rel)
            if n <= 0:
                return
            rel += n
        os.posix_fadvise(fd, end, LOAD_AHEAD_BYTES, os.POSIX_FADV_WILLNEED)
    except OSError:
        return
    finally:
        os.close(fd)


def _create(path: str, size: int) -> int:
    """Create a full-size segment under `<path>.tmp`, then rename it: a crash in between
    never leaves a short file under a real segment name."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _preallocate(fd, size)
        os.rename(tmp, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _preallocate(fd: int, size: int) -> None:
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise StoreError(f"cannot allocate a {size}-byte commit-log segment: {exc}") from exc
        os.ftruncate(fd, size)  # a file system without fallocate: a sparse file will do

"""The checkpoint file: how far the store is known to be durable, and whether it stopped cleanly.

`<root>/checkpoint`, 40 bytes, little-endian::

    off size field              type
      0    4 magic              u32  CHECKPOINT_MAGIC
      4    4 version            u32  1
      8    8 commit_offset      i64  commit log durable (fdatasync'd) below this
     16    8 dispatch_offset    i64  consume queues and index durable for records below this
     24    8 written_ms         i64  wall clock when written
     32    4 clean              u32  1 = written by a clean close, nothing after it
     36    4 crc                u32  CRC32C of bytes [0, 36)

Written to `checkpoint.tmp`, fsynced, renamed over `checkpoint`, directory
fsynced: a reader sees the old or the new file, never a mix. The CRC catches the
rest (a bad file is ignored and recovery scans the whole log).
"""
from __future__ import annotations

import logging
import os
import struct
import time
from dataclasses import dataclass

from crc32c import crc32c

from ferry.atomic_file import replace_durably

log = logging.getLogger(__name__)

CHECKPOINT = struct.Struct("<IIqqqII")
CHECKPOINT_FIELDS = ("magic", "version", "commit_offset", "dispatch_offset", "written_ms", "clean",
                     "crc")
CHECKPOINT_MAGIC = 0x4B595246  # b"FRYK"
CHECKPOINT_VERSION = 1
CHECKPOINT_FILE = "checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    """Durable positions recorded by the checkpoint thread and by close()."""

    commit_offset: int
    dispatch_offset: int
    clean: bool
    written_ms: int = 0


def write_checkpoint(root_dir: str, cp: Checkpoint) -> None:
    """Atomically replace the checkpoint file."""
    written_ms = cp.written_ms or int(time.time() * 1000)
    head = CHECKPOINT.pack(CHECKPOINT_MAGIC, CHECKPOINT_VERSION, cp.commit_offset,
                           cp.dispatch_offset, written_ms, int(cp.clean), 0)[:-4]
    replace_durably(os.path.join(root_dir, CHECKPOINT_FILE), head + struct.pack("<I", crc32c(head)))


def sync_files(paths: list[str], *, data_only: bool = True) -> None:
    """fdatasync (or fsync, for directories) each path; one deleted meanwhile is skipped.

    The checkpoint makes consume-queue and index files durable this way, by path,
    outside the store lock: it persists a file's dirty mapped pages like msync but
    releases the GIL, whether or not the file is still mapped.
    """
    sync = os.fdatasync if data_only else os.fsync
    for path in paths:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            sync(fd)
        finally:
            os.close(fd)


def read_checkpoint(root_dir: str) -> Checkpoint | None:
    """The checkpoint, or None when missing or damaged (then recovery trusts nothing)."""
    path = os.path.join(root_dir, CHECKPOINT_FILE)
    try:
        with open(path, "rb") as f:
            data = f.read(CHECKPOINT.size + 1)
    except FileNotFoundError:
        return None
    if len(data) != CHECKPOINT.size:
        log.warning("checkpoint %s has size %d, ignoring it", path, len(data))
        return None
    magic, version, commit, dispatch, written_ms, clean, crc = CHECKPOINT.unpack(data)
    if magic != CHECKPOINT_MAGIC or version != CHECKPOINT_VERSION or crc32c(data[:-4]) != crc:
        log.warning("checkpoint %s fails its magic/version/crc check, ignoring it", path)
        return None
    if commit < 0 or dispatch < 0 or clean not in (0, 1):
        log.warning("checkpoint %s holds impossible values, ignoring it", path)
        return None
    return Checkpoint(commit, dispatch, bool(clean), written_ms)

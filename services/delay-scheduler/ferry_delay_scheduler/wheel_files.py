"""The timing wheel's files: bucket files (what is due when) and journals (what became of it).

Both live under `<data_dir>/wheel/`, one pair per bucket of due time (a minute
by default), named by the bucket number `due_ms // bucket_ms` in 12 digits:

    <bucket>.bkt   entries (due_ms, phy_offset): a message of the local log due in this bucket
    <bucket>.jnl   entries (phy_offset, time_ms, state): sending, delivered, cancelled

Both start with the same 16-byte header and then hold fixed 24-byte entries,
each with a CRC32C of its first 20 bytes, appended with one write() per batch.
A crash can leave a torn last entry (the file length is not header + n*24) or,
after a power loss, entries that are zeros or garbage: `read_entries` skips
every entry whose CRC fails, and `repair` cuts a torn tail so that the next
append starts on an entry boundary. The byte tables are in docs/delay.md.
"""
from __future__ import annotations

import enum
import os
import struct
from collections.abc import Iterable, Iterator
from typing import NamedTuple

from crc32c import crc32c

#   0 magic 4s | 4 version u16 | 6 kind u16 (1 bucket, 2 journal) | 8 bucket_start_ms i64
FILE_HEADER = struct.Struct("<4sHHq")
FILE_HEADER_FIELDS = ("magic", "version", "kind", "bucket_start_ms")
FILE_MAGIC = b"FDWH"
FILE_VERSION = 1
KIND_BUCKET = 1
KIND_JOURNAL = 2
#   0 due_ms i64 | 8 phy_offset i64 | 16 reserved u32 (0) | 20 crc u32 (CRC32C of [0, 20))
BUCKET_ENTRY = struct.Struct("<qqII")
BUCKET_ENTRY_FIELDS = ("due_ms", "phy_offset", "reserved", "crc")
#   0 phy_offset i64 | 8 time_ms i64 | 16 state u32 | 20 crc u32 (CRC32C of [0, 20))
JOURNAL_ENTRY = struct.Struct("<qqII")
JOURNAL_ENTRY_FIELDS = ("phy_offset", "time_ms", "state", "crc")
ENTRY_SIZE = 24
CRC_COVERS = 20
BUCKET_SUFFIX = ".bkt"
JOURNAL_SUFFIX = ".jnl"
NAME_DIGITS = 12
_PREFIX = struct.Struct("<qqI")  # the 20 bytes a CRC covers
_CRC = struct.Struct("<I")


class EntryState(enum.IntEnum):
    """What a journal entry records about one message of a bucket."""

    SENDING = 1    # a DELIVER_DUE carrying it is about to leave (an intent: may be a duplicate)
    DELIVERED = 2  # the broker acknowledged it
    CANCELLED = 3  # cancelled before delivery; never delivered


FINAL_STATES = frozenset({EntryState.DELIVERED, EntryState.CANCELLED})


class BucketEntry(NamedTuple):
    due_ms: int
    phy_offset: int


class JournalEntry(NamedTuple):
    phy_offset: int
    time_ms: int
    state: int


def file_name(bucket: int, suffix: str) -> str:
    return f"{bucket:0{NAME_DIGITS}d}{suffix}"


def parse_name(name: str, suffix: str) -> int | None:
    """The bucket number of a file called `name`, or None when it is not such a file."""
    if not name.endswith(suffix):
        return None
    stem = name[:-len(suffix)]
    return int(stem) if len(stem) == NAME_DIGITS and stem.isdigit() else None


def encode_entry(a: int, b: int, c: int) -> bytes:
    """One 24-byte entry (bucket: due_ms, phy, 0; journal: phy, time_ms, state) with its CRC."""
    prefix = _PREFIX.pack(a, b, c)
    return prefix + _CRC.pack(crc32c(prefix))


def encode_bucket_entries(entries: Iterable[BucketEntry]) -> bytes:
    return b"".join(encode_entry(due, phy, 0) for due, phy in entries)


def encode_journal_entries(entries: Iterable[JournalEntry]) -> bytes:
    return b"".join(encode_entry(phy, t, state) for phy, t, state in entries)


def header_bytes(kind: int, bucket_start_ms: int) -> bytes:
    return FILE_HEADER.pack(FILE_MAGIC, FILE_VERSION, kind, bucket_start_ms)


class ReadResult(NamedTuple):
    """Entries read from a file, how many failed their CRC, and the valid byte length."""

    entries: list[tuple[int, int, int]]
    bad_entries: int
    valid_bytes: int


def read_entries(path: str, kind: int) -> ReadResult:
    """Every entry of a bucket or journal file whose CRC holds (missing file: none)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return ReadResult([], 0, 0)
    if len(data) < FILE_HEADER.size:
        return ReadResult([], 0, 0)
    magic, version, got_kind, _ = FILE_HEADER.unpack_from(data, 0)
    if magic != FILE_MAGIC or version != FILE_VERSION or got_kind != kind:
        raise ValueError(f"{path} is not a version-{FILE_VERSION} wheel file of kind {kind}")
    body = len(data) - FILE_HEADER.size
    whole = body - body % ENTRY_SIZE
    out: list[tuple[int, int, int]] = []
    bad = 0
    view = memoryview(data)[FILE_HEADER.size:FILE_HEADER.size + whole]
    for a, b, c, crc in BUCKET_ENTRY.iter_unpack(view):
        # One CRC per entry: a torn or zeroed entry is dropped alone (an all-zero
        # entry fails too, since CRC32C of 20 zero bytes is not 0).
        i = len(out) + bad
        if crc32c(view[i * ENTRY_SIZE:i * ENTRY_SIZE + CRC_COVERS]) != crc:
            bad += 1
            continue
        out.append((a, b, c))
    return ReadResult(out, bad, FILE_HEADER.size + whole)


def iter_bucket(path: str) -> Iterator[BucketEntry]:
    for due, phy, _ in read_entries(path, KIND_BUCKET).entries:
        yield BucketEntry(due, phy)


def append(path: str, kind: int, bucket_start_ms: int, data: bytes, *, sync: bool = False) -> None:
    """Append whole entries to a file, creating it with its header (and repairing a torn tail)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size < FILE_HEADER.size or (size - FILE_HEADER.size) % ENTRY_SIZE:
            size = _repair_fd(fd, size, kind, bucket_start_ms)
        if data:
            _write_all(fd, data)
        if sync:
            os.fdatasync(fd)
    finally:
        os.close(fd)


def _repair_fd(fd: int, size: int, kind: int, bucket_start_ms: int) -> int:
    """Cut a torn tail (or write a missing header); the new size."""
    if size < FILE_HEADER.size:
        os.ftruncate(fd, 0)
        _write_all(fd, header_bytes(kind, bucket_start_ms))
        return FILE_HEADER.size
    keep = size - (size - FILE_HEADER.size) % ENTRY_SIZE
    os.ftruncate(fd, keep)
    return keep


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def fsync_path(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fdatasync(fd)
    finally:
        os.close(fd)


def sync_paths(paths: list[str], directory: str) -> None:
    """fdatasync each file, then the directory (it may hold new names)."""
    for path in paths:
        fsync_path(path)
    if paths:
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

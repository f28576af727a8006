"""The store's small list files (`epochs`, `histories`): a head, fixed-size entries, a CRC.

Layout, little-endian::

    head (magic u32 | version u32 | count u32 | the file's own fields) | count x entry
    | crc u32 (CRC32C of every byte before it)

Rewritten whole with `ferry.atomic_file.replace_durably` (a crash leaves the old
file or the new one); a file that fails a check raises StoreError naming it.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from ferry.atomic_file import replace_durably
from ferry.errors import StoreError

_CRC = struct.Struct("<I")


@dataclass(frozen=True)
class EntryFile:
    """One kind of list file: its name in the store's root, what it is called in errors,
    its head (magic, version, count, then its own fields), its entry, and the most
    entries it may hold."""

    name: str
    what: str
    magic: int
    version: int
    head: struct.Struct
    entry: struct.Struct
    max_entries: int


def save_entries(fmt: EntryFile, path: str, head_extra: tuple[int, ...],
                 entries: list[tuple[int, int]]) -> None:
    """Write the file: the head (with `head_extra`, its own fields), then `entries`."""
    if len(entries) > fmt.max_entries:
        raise StoreError(f"the {fmt.what} would hold more than {fmt.max_entries} entries")
    body = fmt.head.pack(fmt.magic, fmt.version, len(entries), *head_extra) + b"".join(
        fmt.entry.pack(*e) for e in entries)
    replace_durably(path, body + _CRC.pack(crc32c(body)))


def load_entries(fmt: EntryFile, path: str
                 ) -> tuple[tuple[int, ...], list[tuple[int, int]]] | None:
    """The unpacked head and the entries of the file at `path`, None when there is none.

    Raises StoreError naming the file when it is truncated, has another magic or
    version, more than `max_entries`, a size its count does not give, or a bad CRC.
    """
    what, head, entry, max_entries = fmt.what, fmt.head, fmt.entry, fmt.max_entries
    try:
        with open(path, "rb") as f:
            data = f.read(head.size + max_entries * entry.size + _CRC.size + 1)
    except FileNotFoundError:
        return None
    if len(data) < head.size + _CRC.size:
        raise StoreError(f"{what} {path} is truncated ({len(data)} bytes)")
    fields = head.unpack_from(data)
    if fields[0] != fmt.magic or fields[1] != fmt.version:
        raise StoreError(f"{what} {path} has a bad magic or version "
                         f"({fields[0]:#x}, {fields[1]})")
    count = fields[2]
    want = head.size + count * entry.size + _CRC.size
    if count > max_entries or len(data) != want:
        raise StoreError(f"{what} {path} has {len(data)} bytes, its header says {want}")
    if _CRC.unpack_from(data, want - _CRC.size)[0] != crc32c(data[:want - _CRC.size]):
        raise StoreError(f"{what} {path} fails its CRC check")
    entries = [(int(a), int(b)) for a, b in entry.iter_unpack(data[head.size:want - _CRC.size])]
    return fields, entries

"""The store's small list files (`epochs`, `histories`): a head, fixed-size entries, a CRC.

Layout, little-endian::

    head (magic u32 | version u32 | count u32 | the file's own fields) | count x entry
    | crc u32 (CRC32C of every byte before it)

Rewritten whole with `ferry.atomic_file.replace_durably` (a crash leaves the old
file or the new one); a file that fails a check raises StoreError naming it.
"""
from __future__ import annotations

import struct

from crc32c import crc32c

from ferry.atomic_file import replace_durably
from ferry.errors import StoreError

_CRC = struct.Struct("<I")


def save_entries(path: str, head: struct.Struct, head_values: tuple[int, ...],
                 entry: struct.Struct, entries: list[tuple[int, int]]) -> None:
    """Write the file: `head` packed from `head_values` (magic, version, count, ...)."""
    body = head.pack(*head_values) + b"".join(entry.pack(*e) for e in entries)
    replace_durably(path, body + _CRC.pack(crc32c(body)))


def load_entries(path: str, what: str, head: struct.Struct, magic: int, version: int,
                 entry: struct.Struct, max_entries: int
                 ) -> tuple[tuple[int, ...], list[tuple[int, int]]] | None:
    """The unpacked head and the entries of the file at `path`, None when there is none.

    Raises StoreError (`what` names the file) when it is truncated, has another
    magic or version, more than `max_entries`, a size its count does not give,
    or a bad CRC.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(head.size + max_entries * entry.size + _CRC.size + 1)
    except FileNotFoundError:
        return None
    if len(data) < head.size + _CRC.size:
        raise StoreError(f"{what} {path} is truncated ({len(data)} bytes)")
    fields = head.unpack_from(data)
    if fields[0] != magic or fields[1] != version:
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

"""The epoch log: which master term (epoch) wrote which part of the commit log (issue 9).

Each broker group elects its master through etcd; every term has an epoch, a
fencing token larger than any before it. A store records, in `<root>/epochs`,
the commit-log offset at which each epoch's records begin. Two stores compare
these lists to find where their logs stop agreeing (`divergence_point`, as
Kafka's leader epoch and RocketMQ 5's epoch file do): a returning old master
truncates there and follows the new one.

File layout (little-endian, an `entry_file`), rewritten whole::

    magic u32 EPOCHS.magic | version u32 | count u32 | count x (epoch i64, start_offset i64)
    | crc u32 (CRC32C of every byte before it)
"""
from __future__ import annotations

import os
import struct

from ferry.errors import StoreError

from .entry_file import EntryFile, load_entries, save_entries

#: magic b"FRYE"; at most one entry per election that wrote to this store.
EPOCHS = EntryFile("epochs", "epoch file", 0x45595246, 1, struct.Struct("<III"),
                   struct.Struct("<qq"), 1_000_000)

Entry = tuple[int, int]  # (epoch, start_offset)


class EpochLog:
    """The (epoch, start_offset) pairs of one store, both strictly increasing, durable."""

    def __init__(self, root_dir: str) -> None:
        self.path = os.path.join(root_dir, EPOCHS.name)
        self._entries: list[Entry] = _load(self.path)

    @property
    def entries(self) -> list[Entry]:
        """Every (epoch, start_offset), oldest first (a copy)."""
        return list(self._entries)

    @property
    def last(self) -> Entry | None:
        """The newest (epoch, start_offset), None when no epoch was recorded."""
        return self._entries[-1] if self._entries else None

    def append(self, epoch: int, start_offset: int) -> None:
        """Record that `epoch`'s records start at `start_offset`; durable when it returns.

        `epoch` must be larger than the last one and `start_offset` not smaller than
        its start. When it equals that start, the last epoch wrote nothing and its
        entry is replaced (an empty term leaves no trace, so starts stay strictly
        increasing).
        """
        if epoch < 0 or start_offset < 0:
            raise StoreError(f"epoch {epoch} and start offset {start_offset} must be >= 0")
        entries = list(self._entries)
        if entries:
            last_epoch, last_start = entries[-1]
            if epoch <= last_epoch or start_offset < last_start:
                raise StoreError(f"epoch ({epoch}, {start_offset}) does not follow the last "
                                 f"({last_epoch}, {last_start}): both must increase")
            if start_offset == last_start:
                entries.pop()
        entries.append((epoch, start_offset))
        self._save(entries)

    def replace(self, entries: list[Entry]) -> None:
        """Make the log exactly `entries` (a master's list, copied by a slave) in one
        durable write: a crash leaves the old list or the new one, never a mix or none."""
        for i, (epoch, start) in enumerate(entries):
            if epoch < 0 or start < 0 or (i and not (epoch > entries[i - 1][0]
                                                     and start > entries[i - 1][1])):
                raise StoreError(f"epoch entries must be >= 0 and strictly increasing: "
                                 f"{entries[max(0, i - 1):i + 1]}")
        if entries != self._entries:
            self._save(list(entries))

    def truncate_from(self, offset: int) -> None:
        """Drop the entries whose epoch starts at or after `offset` (the log was cut there)."""
        keep = [e for e in self._entries if e[1] < offset]
        if len(keep) != len(self._entries):
            self._save(keep)

    def _save(self, entries: list[Entry]) -> None:
        save_entries(EPOCHS, self.path, (), entries)
        self._entries = entries


def _load(path: str) -> list[Entry]:
    """The entries of the epoch file at `path` ([] when there is none)."""
    got = load_entries(EPOCHS, path)
    entries = got[1] if got is not None else []
    for (e0, s0), (e1, s1) in zip(entries, entries[1:], strict=False):
        if not (e1 > e0 and s1 > s0):
            raise StoreError(f"epoch file {path} holds entries out of order: "
                             f"({e0}, {s0}) then ({e1}, {s1})")
    if entries and (entries[0][0] < 0 or entries[0][1] < 0):
        raise StoreError(f"epoch file {path} holds a negative epoch or offset")
    return entries


def _end_of(entries: list[Entry], i: int, log_end: int) -> int:
    return entries[i + 1][1] if i + 1 < len(entries) else log_end


def divergence_point(mine: list[Entry], leaders: list[Entry], leader_end: int,
                     my_end: int) -> int:
    """The commit-log offset up to which my log and the leader's agree.

    The largest epoch both lists hold was written by one master, so both logs hold
    the same records of it, as far as both have them: the logs agree up to the
    smaller of where that epoch ends on each side (the start of the next epoch
    there, or that log's end). Logs that share no epoch agree on nothing (0).
    """
    theirs = {epoch: i for i, (epoch, _) in enumerate(leaders)}
    for j in range(len(mine) - 1, -1, -1):
        i = theirs.get(mine[j][0])
        if i is not None:
            return min(_end_of(mine, j, my_end), _end_of(leaders, i, leader_end))
    return 0

"""Finding a message by id through the index's id runs (docs/store-format.md, "Index keys").

The put path indexes message ids by run, not one by one: the first record of a
run of at most `MAX_ID_RUN` records that lie back to back in the commit log and
share their id window (the first 15 bytes and the high 4 bits of the last) gets
the key `b"R" + id_window(msg_id)`. A producer's ids are 8 random bytes and a
big-endian counter, so a batch of 256 makes about 16 keys instead of 256: the
index insert, a random write into a large slot table, was the put path's largest
cost after encoding. A query walks each run its key points to, reading record
heads until an id of another window (or MAX_ID_RUN records): the records of at
most 16 ids, however many puts stored them.
Records the broker writes itself (`put_batch`: a committed transaction's message,
retries) and records with a hooked flag (a transaction's half, a delayed or TTL
message) keep an exact key `b"I" + msg_id`, as every record of a store written
before id runs has: the broker looks those up by id on its hot paths, and an exact
key reads one record where a run walk reads its window's.
"""
from __future__ import annotations

from ferry.codec.record import AT_MSG_ID, HEADER_SIZE, RECORD_MAGIC, SIZE_MAGIC, StoredMessage

from .commit_log import CommitLog
from .index_file import IndexService
from .index_keys import MAX_ID_RUN, exact_id_key, id_window, run_key
from .reader import read_message

# Runs (index candidates) one id query walks at most, and b"I" keys it checks. Each run
# holds at least one of the 16 ids of its window, so unique ids make at most
# MAX_ID_RUN runs per window; the rest is room for ids stored twice and hash collisions.
MAX_ID_RUNS_QUERIED = 4 * MAX_ID_RUN
MAX_ID_KEYS_QUERIED = 8
_ID_END = AT_MSG_ID + 16


def find_by_id(cl: CommitLog, index: IndexService, msg_id: bytes) -> StoredMessage | None:
    """The newest stored message with this 16-byte id (its record checked), or None.

    Both kinds of key are looked up and the newer record answers: a record may be
    indexed by its exact id (b"I": what the broker writes itself, hooked messages,
    older stores) and a copy of it by run, or the other way round."""
    exact: StoredMessage | None = None
    for phy in index.query(exact_id_key(msg_id), 0, 2**62, MAX_ID_KEYS_QUERIED):
        msg = read_message(cl, phy)
        if msg is not None and msg.msg_id == msg_id:
            exact = msg  # candidates come newest first
            break
    # Candidates come newest first and runs never overlap, so each walk stops where the
    # newer candidate starts: every record is read at most once.
    stop = cl.write_offset
    for phy in index.query(run_key(msg_id), 0, 2**62, MAX_ID_RUNS_QUERIED):
        found = _find_in_run(cl, phy, stop, msg_id)
        if found is not None:
            if exact is None or found.phy_offset > exact.phy_offset:
                return found
            return exact
        stop = min(stop, phy)
    return exact


def _find_in_run(cl: CommitLog, phy: int, stop: int, msg_id: bytes) -> StoredMessage | None:
    """The newest record with `msg_id` in the id run starting at `phy` (back-to-back
    records sharing the id window), not past `stop`.

    Newest, like every id query: a run built by re-dispatch or on a replica can hold a
    transaction's half and its committed copy (same id), and the newer one answers."""
    window = id_window(msg_id)
    matches: list[int] = []
    for _ in range(MAX_ID_RUN):
        if phy >= stop:
            break
        head = cl.read(phy, HEADER_SIZE)
        if head is None:
            break
        size, magic = SIZE_MAGIC.unpack_from(head, 0)
        if magic != RECORD_MAGIC or size <= HEADER_SIZE:
            break  # a blank marker (the run ended with its segment) or no record
        rid = bytes(head[AT_MSG_ID:_ID_END])
        if rid == msg_id:
            matches.append(phy)
        elif id_window(rid) != window:
            break  # the run ended (or the key was another window's hash)
        phy += size
    for at in reversed(matches):
        msg = read_message(cl, at)  # checks the whole record (CRC, its own offset)
        if msg is not None and msg.msg_id == msg_id:
            return msg
    return None

"""Finding a message by id through the index's id runs (docs/store-format.md, "Index keys").

The put path indexes message ids by run, not one by one: the first record of a
run of at most `MAX_ID_RUN` records that lie back to back in the commit log and
share their first `ID_RUN_PREFIX_BYTES` id bytes gets the key
`b"R" + msg_id[:ID_RUN_PREFIX_BYTES]`. A producer's ids are 8 random bytes and
a big-endian counter, so a batch of 256 usually makes one or two keys instead
of 256: the index insert, a random write into a large slot table, was the put
path's largest cost after encoding. A query walks each run its key points to,
reading record heads until an id with another prefix (or MAX_ID_RUN records).
Stores written before id runs indexed each id as `b"I" + msg_id`: those keys
are still looked up.
"""
from __future__ import annotations

from ferry.codec.record import AT_MSG_ID, HEADER_SIZE, RECORD_MAGIC, SIZE_MAGIC, StoredMessage

from .commit_log import CommitLog
from .encode_context import ID_RUN_PREFIX_BYTES, MAX_ID_RUN
from .index_file import IndexService
from .reader import read_message

# Runs (index candidates) one id query walks at most, and b"I" keys it checks. Each run
# holds at least one of the 256 ids that share a prefix, so unique ids make at most
# MAX_ID_RUN runs per prefix; the rest is room for ids stored twice and hash collisions.
MAX_ID_RUNS_QUERIED = 4 * MAX_ID_RUN
MAX_ID_KEYS_QUERIED = 8
_ID_END = AT_MSG_ID + 16


def run_key(msg_id: bytes) -> bytes:
    """The index key of the id run that holds `msg_id`."""
    return b"R" + msg_id[:ID_RUN_PREFIX_BYTES]


def find_by_id(cl: CommitLog, index: IndexService, msg_id: bytes) -> StoredMessage | None:
    """The newest stored message with this 16-byte id (its record checked), or None."""
    # Candidates come newest first and runs never overlap, so each walk stops where the
    # newer candidate starts: every record is read at most once (the half messages of
    # one producer, each its own run, must not make a query quadratic).
    stop = cl.write_offset
    for phy in index.query(run_key(msg_id), 0, 2**62, MAX_ID_RUNS_QUERIED):
        found = _find_in_run(cl, phy, stop, msg_id)
        if found is not None:
            return found
        stop = min(stop, phy)
    for phy in index.query(b"I" + msg_id, 0, 2**62, MAX_ID_KEYS_QUERIED):  # older stores
        msg = read_message(cl, phy)
        if msg is not None and msg.msg_id == msg_id:
            return msg
    return None


def _find_in_run(cl: CommitLog, phy: int, stop: int, msg_id: bytes) -> StoredMessage | None:
    """The newest record with `msg_id` in the id run starting at `phy` (back-to-back
    records sharing the id prefix), not past `stop`.

    Newest, like every id query: a run built by re-dispatch or on a replica can hold a
    transaction's half and its committed copy (same id), and the newer one answers."""
    prefix = msg_id[:ID_RUN_PREFIX_BYTES]
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
        elif rid[:ID_RUN_PREFIX_BYTES] != prefix:
            break  # the run ended (or the key was another prefix's hash)
        phy += size
    for at in reversed(matches):
        msg = read_message(cl, at)  # checks the whole record (CRC, its own offset)
        if msg is not None and msg.msg_id == msg_id:
            return msg
    return None

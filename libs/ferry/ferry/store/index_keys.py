"""The index-key rule: which keys a record is indexed under, written once.

docs/store-format.md ("Index files") states it; every writer of index items
(the put path's staging loop `batch_input.py`, re-dispatch `dispatch.py`, a
replica's dispatch `replica.py`) and every query (`MessageStore.query_by_key`,
`id_index.py`) takes its keys from here:

- `b"K" + topic + b"\\x00" + key` for each space-separated key of the record;
- its exact id `b"I" + msg_id` when the record carries a hooked flag
  (EXACT_ID_FLAGS: a transaction's half, a delayed or TTL message, looked up by
  id on the broker's hot paths) or its writer asks for exact ids (`put_batch`);
- otherwise, when it starts an id run, `b"R" + id_window(msg_id)`: a run is at
  most MAX_ID_RUN records back to back in the commit log that share their id
  window (the first ID_RUN_PREFIX_BYTES bytes and the high bits of the last).

An index stores `key_hash(key)`, the CRC32C of the key. Writers hash a key by
continuing the CRC of its constant prefix (`crc32c(msg_id, ID_KEY_CRC)` equals
`key_hash(b"I" + msg_id)`), so no key bytes are built per record.
"""
from __future__ import annotations

from crc32c import crc32c

from ferry.codec.message_flags import HOOKED_FLAGS
from ferry.codec.record import (
    H_BORN_HOST_LEN,
    H_FLAGS,
    H_KEYS_LEN,
    H_MSG_ID,
    H_STORE_HOST_LEN,
    H_STORE_TS_MS,
    H_TAGS_LEN,
    H_TOPIC_LEN,
    H_TOTAL_SIZE,
    HEADER_SIZE,
)

#: Index items as writers queue them: (key hash, phy offset, store timestamp ms).
IndexItem = tuple[int, int, int]

# Records indexed under their exact id (b"I" + msg_id) instead of an id run: the ones
# the broker looks up by id on a hot path (a transaction's half and what END writes, a
# delayed message), so that such a query reads one record, not its id window's.
EXACT_ID_FLAGS = HOOKED_FLAGS
ID_KEY_CRC = crc32c(b"I")  # index key b"I" + msg_id hashes as crc32c(msg_id, ID_KEY_CRC)
# A producer's ids are 8 random bytes, then a big-endian counter, so a window holds 16
# consecutive ids: a batch of 256 makes about 16 keys, and a query walks the records of
# at most 16 ids (however many separate puts stored them: a transaction's half messages
# are one put each).
ID_RUN_PREFIX_BYTES = 15
ID_RUN_LOW_BITS = 4              # the last id byte's bits a window does not fix
MAX_ID_RUN = 1 << ID_RUN_LOW_BITS
ID_RUN_KEY_CRC = crc32c(b"R")  # key b"R" + window hashes as crc32c(window, ID_RUN_KEY_CRC)
# The window's last byte, by the high bits of the id's last byte.
ID_WINDOW_BYTE = tuple(bytes((i,)) for i in range(256 >> ID_RUN_LOW_BITS))


def key_hash(key: bytes) -> int:
    """The stable hash of an index key (CRC32C; never Python's per-process hash())."""
    return crc32c(key)


def id_window(msg_id: bytes) -> bytes:
    """The id run window of a 16-byte id (its index key without the b"R")."""
    return msg_id[:ID_RUN_PREFIX_BYTES] + ID_WINDOW_BYTE[msg_id[ID_RUN_PREFIX_BYTES]
                                                         >> ID_RUN_LOW_BITS]


def exact_id_key(msg_id: bytes) -> bytes:
    """The exact index key of a message id."""
    return b"I" + msg_id


def run_key(msg_id: bytes) -> bytes:
    """The index key of the id run that holds `msg_id`."""
    return b"R" + id_window(msg_id)


def message_key(topic_b: bytes, key_b: bytes) -> bytes:
    """The index key of one of a record's keys (UTF-8) in its topic (UTF-8)."""
    return b"K" + topic_b + b"\x00" + key_b


def key_prefix_crc(topic_b: bytes) -> int:
    """The CRC of the key prefix of `topic_b`: crc32c(key, it) is a message key's hash."""
    return crc32c(b"K" + topic_b + b"\x00")


class IdRuns:
    """The index items of records dispatched one by one, in commit-log order: the id run
    a record continues, and each record's keys (re-dispatch and a replica's dispatch;
    the put path's staging loop inlines the same rule)."""

    __slots__ = ("_prefix", "_left", "_next")

    def __init__(self) -> None:
        self._prefix = b""  # the window of the run being continued
        self._left = 0      # records it may still take
        self._next = -1     # where the next record must start to continue it

    def add(self, items: list[IndexItem], h: tuple, buf: bytes | memoryview, off: int,
            key_crc: int, phy: int) -> None:
        """Append to `items` the index items of the checked record at `buf[off:]`, stored
        at commit-log offset `phy`, whose header (HEADER unpacked, or a struct extending
        it) is `h`; `key_crc` is key_prefix_crc of its topic."""
        msg_id, store_ts_ms = h[H_MSG_ID], h[H_STORE_TS_MS]
        if h[H_FLAGS] & EXACT_ID_FLAGS:  # its exact key; the run (if any) ends here
            items.append((crc32c(msg_id, ID_KEY_CRC), phy, store_ts_ms))
            self._left = 0
        else:
            window = id_window(msg_id)
            if self._left and phy == self._next and window == self._prefix:
                self._left -= 1
            else:
                items.append((crc32c(window, ID_RUN_KEY_CRC), phy, store_ts_ms))
                self._prefix, self._left = window, MAX_ID_RUN - 1
        self._next = phy + h[H_TOTAL_SIZE]
        keys_len = h[H_KEYS_LEN]
        if keys_len:
            at = (off + HEADER_SIZE + h[H_TOPIC_LEN] + h[H_BORN_HOST_LEN] + h[H_STORE_HOST_LEN]
                  + h[H_TAGS_LEN])
            for key in bytes(buf[at:at + keys_len]).split(b" "):
                if key:
                    items.append((crc32c(key, key_crc), phy, store_ts_ms))

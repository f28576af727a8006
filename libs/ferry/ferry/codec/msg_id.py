"""Message ids: 16 bytes, 8 random per process then a 64-bit big-endian counter.

Shown as 32 upper-case hex characters. Sixteen zero bytes mean "none" where a
layout has a slot for one (the SEND entry: the broker assigns it).
"""
from __future__ import annotations

import itertools
import os

from ferry.codec.limits import MSG_ID_BYTES

#: The all-zero id: "assign one" in a SEND entry.
NO_MSG_ID = bytes(MSG_ID_BYTES)

_ID_PREFIX = os.urandom(8)
_id_counter = itertools.count(int.from_bytes(os.urandom(4), "little") << 8)
_pid = os.getpid()


def new_msg_id() -> bytes:
    """A fresh 16-byte message id, unique per process (a fork gets a new prefix)."""
    global _ID_PREFIX, _id_counter, _pid
    if os.getpid() != _pid:  # forked: a child must not repeat the parent's ids
        _pid = os.getpid()
        _ID_PREFIX = os.urandom(8)
        _id_counter = itertools.count(int.from_bytes(os.urandom(4), "little") << 8)
    return _ID_PREFIX + next(_id_counter).to_bytes(8, "big")


def msg_id_hex(msg_id: bytes) -> str:
    """The id as shown to people: 32 upper-case hex characters."""
    return msg_id.hex().upper()


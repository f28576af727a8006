"""Message ids: 16 bytes, 8 random per process then a 64-bit big-endian counter.

Shown as 32 upper-case hex characters. Sixteen zero bytes mean "none" where a
layout has a slot for one (the SEND entry: the broker assigns it).

A forked child gets a new prefix (and counter) from an `os.register_at_fork`
hook, so making an id costs no `getpid()` system call: producers make one per
message. `itertools.count` keeps the counter safe to share between threads.
"""
from __future__ import annotations

import itertools
import os
from collections.abc import Callable

from ferry.codec.limits import MSG_ID_BYTES

#: The all-zero id: "assign one" in a SEND entry.
NO_MSG_ID = bytes(MSG_ID_BYTES)
_PREFIX_BYTES = 8
_COUNTER_START_BYTES = 4   # the counter starts at a random value of this many bytes, << 8


def _fresh_counter() -> itertools.count[int]:
    return itertools.count(int.from_bytes(os.urandom(_COUNTER_START_BYTES), "little") << 8)


_ID_PREFIX = os.urandom(_PREFIX_BYTES)
_id_counter = _fresh_counter()


def _after_fork_in_child() -> None:
    """A child must not repeat its parent's ids: a new prefix and counter."""
    global _ID_PREFIX, _id_counter
    _ID_PREFIX = os.urandom(_PREFIX_BYTES)
    _id_counter = _fresh_counter()


if hasattr(os, "register_at_fork"):   # POSIX; elsewhere there is no fork to survive
    os.register_at_fork(after_in_child=_after_fork_in_child)


def new_msg_id() -> bytes:
    """A fresh 16-byte message id, unique per process (a fork gets a new prefix)."""
    return _ID_PREFIX + next(_id_counter).to_bytes(8, "big")


def msg_id_source() -> tuple[bytes, Callable[[], int]]:
    """This process's id prefix and its counter's `next`: `prefix + next().to_bytes(8, "big")`
    is `new_msg_id()`, for a loop that makes many ids (take a fresh pair per loop: a fork
    replaces both)."""
    return _ID_PREFIX, _id_counter.__next__


def msg_id_hex(msg_id: bytes) -> str:
    """The id as shown to people: 32 upper-case hex characters."""
    return msg_id.hex().upper()

"""The shared formats of Ferry: what the store, the wire and the clients all read and write.

A leaf package like `ferry.errors` and `ferry.names`: it imports nothing else
of Ferry, so that `ferry.store`, `ferry.wire` and `ferry.client` can all
depend on it without depending on each other.
"""
from __future__ import annotations

from ferry.codec.message_flags import HOOKED_FLAGS, MessageFlag
from ferry.codec.system_properties import (
    DELIVER_AT_MS,
    ORIGIN_OFFSET,
    ORIGIN_TOPIC,
    REAL_QUEUE_ID,
    REAL_TOPIC,
    RECONSUME_TIMES,
    SYSTEM_PROPERTIES,
    TTL_MS,
)

__all__ = [
    # message flags
    "HOOKED_FLAGS", "MessageFlag",
    # system property names
    "DELIVER_AT_MS", "ORIGIN_OFFSET", "ORIGIN_TOPIC", "REAL_QUEUE_ID", "REAL_TOPIC",
    "RECONSUME_TIMES", "SYSTEM_PROPERTIES", "TTL_MS",
]

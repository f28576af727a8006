"""The wire protocol's numbers: version, limits, request codes and frame flags.

Everything here is written down byte by byte in `docs/protocol.md`, and
`tests/wire/test_protocol_doc.py` holds the two together.
"""
from __future__ import annotations

from enum import IntEnum, IntFlag

#: The `v` key of every frame header. A peer that sees another version closes
#: the connection (see docs/protocol.md, "Versioning").
PROTOCOL_VERSION = 1

#: The largest `frame_length` accepted: the bytes after the 4-byte length prefix.
MAX_FRAME_BYTES = 16 * 1024 * 1024
#: The largest msgpack header accepted.
MAX_HEADER_BYTES = 64 * 1024
# The largest single message body (one entry of a SEND batch) is `MAX_BODY_BYTES`,
# declared with every other message limit in ferry.codec.limits.

#: Request ids are unsigned 32-bit numbers chosen by the requester.
MAX_REQUEST_ID = 2**32 - 1


class RequestCode(IntEnum):
    """What a frame asks for; responses carry the code of their request.

    1-9 are about the connection itself (IDENTIFY). 10-29 are the core mesh (send,
    pull, offsets, queries, membership). 30 and above are kept for later families:
    queue locks, transactions, replication.
    """

    IDENTIFY = 1        # which broker this is: the target a client signs for (never signed)

    SEND = 10
    PULL = 11
    COMMIT_OFFSET = 12
    QUERY_OFFSET = 13
    GET_MIN_MAX = 14
    OFFSET_FOR_TIME = 15
    QUERY_BY_ID = 16
    QUERY_BY_KEY = 17
    HEARTBEAT = 18
    UNREGISTER = 19
    GET_CONSUMERS = 20
    SEND_BACK = 21      # a consumer's nack: the copy goes to %RETRY%<group> (via %SCHEDULE%) or %DLQ%
    DELIVER_DUE = 22    # the delay scheduler re-sends due messages to their real topic
    END_TRANSACTION = 30    # commit or roll back a transactional half message
    CHECK_TRANSACTION = 31  # txn-checker -> broker; broker -> a live producer of the group
    LOCK = 32               # an ordered consumer locks (or renews) its queues at their broker
    UNLOCK = 33             # ... and releases them once their in-flight message is committed


class Flag(IntFlag):
    """Bits of a frame header's `f` key."""

    RESPONSE = 1  # the frame answers the request with the same id
    ONEWAY = 2  # the requester wants no response (never set on a response)

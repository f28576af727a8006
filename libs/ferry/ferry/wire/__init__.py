"""ferry.wire: the Ferry wire protocol, sans-IO.

Frames, request codes, the SEND message batch and the request/response
helpers. Nothing here touches a socket or an event loop: connection code
feeds bytes to a FrameDecoder and writes what encode_frame_parts returns.
The byte layout is specified in docs/protocol.md; the message limits and the
SEND-entry layout come from `ferry.codec` (re-exported here under the
protocol's names).
"""
from __future__ import annotations

from ferry.codec.limits import MAX_BODY_BYTES, MAX_KEYS_BYTES, MAX_TAGS_BYTES, MSG_ID_BYTES
from ferry.wire.codes import (
    MAX_FRAME_BYTES,
    MAX_HEADER_BYTES,
    MAX_REQUEST_ID,
    PROTOCOL_VERSION,
    Flag,
    RequestCode,
)
from ferry.wire.decoder import FrameDecoder, decode_frame
from ferry.wire.frame import (
    FRAME_PREFIX,
    Frame,
    MalformedFrameError,
    describe,
    encode_frame,
    encode_frame_parts,
)
from ferry.wire.helpers import check_response, error_response, request, response
from ferry.wire.messages import WireMessage, decode_messages, encode_messages
from ferry.wire.pull import (
    MAX_PULL_BYTES,
    MAX_PULL_COUNT,
    PullAnswer,
    PullRequest,
    PullStatus,
)

__all__ = [
    # protocol numbers
    "PROTOCOL_VERSION",
    "MAX_FRAME_BYTES",
    "MAX_HEADER_BYTES",
    "MAX_BODY_BYTES",
    "MAX_REQUEST_ID",
    "RequestCode",
    "Flag",
    # frames
    "Frame",
    "FrameDecoder",
    "MalformedFrameError",
    "encode_frame",
    "encode_frame_parts",
    "decode_frame",
    "describe",
    "FRAME_PREFIX",
    # requests and responses
    "request",
    "response",
    "error_response",
    "check_response",
    # the SEND message batch
    "WireMessage",
    "encode_messages",
    "decode_messages",
    "MSG_ID_BYTES",
    "MAX_TAGS_BYTES",
    "MAX_KEYS_BYTES",
    # PULL
    "PullRequest",
    "PullAnswer",
    "PullStatus",
    "MAX_PULL_COUNT",
    "MAX_PULL_BYTES",
]

"""The bits of a message's `flags` (the SEND entry's and the stored record's u32).

A producer sets a flag for each feature whose data travels in the message's
system properties (see `system_properties`); the broker's put pipeline acts on
the flagged entries only, so an unflagged batch takes the fast path untouched.
"""
from __future__ import annotations

from enum import IntFlag


class MessageFlag(IntFlag):
    """Bits of a message's flags field."""

    #: Deliver no earlier than the `DELIVER_AT_MS` property: the broker stores it in
    #: `%SCHEDULE%` and the delay scheduler re-sends it to its real topic when due.
    DELAY = 1
    #: Never hand the message to a consumer once `TTL_MS` has passed since it was
    #: stored in its topic (the broker skips it on pull and counts it as expired).
    TTL = 2
    #: A transactional half message: the broker stores it in `%HALF%`, invisible to
    #: consumers, until END_TRANSACTION commits it to its real topic or rolls it back.
    TXN_HALF = 4
    #: The message carries W3C trace context (`TRACEPARENT`, maybe `TRACESTATE`) in its
    #: system properties: every hop that traces checks this bit and parses properties only
    #: when it is set. Not a hooked flag: a batch announcing only TRACED keeps the fast path.
    TRACED = 8


#: Flags that a before-put hook of the broker must see: a SEND whose frame does not
#: announce them (the `flags` field) may not carry them.
HOOKED_FLAGS = int(MessageFlag.DELAY | MessageFlag.TTL | MessageFlag.TXN_HALF)

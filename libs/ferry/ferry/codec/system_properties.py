"""Names of the properties Ferry itself sets on a message (user properties never use them).

Values are text, like every property. Where a message is redirected through
an internal topic (`%SCHEDULE%`, `%RETRY%<group>`, `%DLQ%<group>`) it keeps its
message id, and these say where it belongs.
"""
from __future__ import annotations

#: Epoch milliseconds before which the message is not delivered (with MessageFlag.DELAY).
DELIVER_AT_MS = "DELIVER_AT_MS"
#: Milliseconds the message may wait in its topic before it expires (with MessageFlag.TTL).
TTL_MS = "TTL_MS"
#: The topic and queue a message stored in `%SCHEDULE%` goes to when due (queue -1: any).
REAL_TOPIC = "REAL_TOPIC"
REAL_QUEUE_ID = "REAL_QUEUE_ID"
#: Where the delay scheduler took a delivered message from: "<broker>/<queue_id>/<queue_offset>"
#: of its `%SCHEDULE%` record.
ORIGIN_OFFSET = "ORIGIN_OFFSET"
#: The topic a consumer first received a retried or dead-lettered message from.
ORIGIN_TOPIC = "ORIGIN_TOPIC"
#: The `reconsume_times` a delivered retry copy carries (the scheduler passes it through).
RECONSUME_TIMES = "RECONSUME_TIMES"

#: The producer group of a transactional half message (whom the check-back asks).
TXN_GROUP = "TXN_GROUP"
#: Milliseconds after its store time before a half message may be checked (default 6 s).
CHECK_IMMUNITY_MS = "CHECK_IMMUNITY_MS"
#: On an `%OP%` record: the half message's id (32 hex), how it ended ("commit" /
#: "rollback") and who ended it ("producer", "check", "discarded"), and the half
#: record's queue offset in `%HALF%`.
TXN_ID = "TXN_ID"
TXN_ACTION = "TXN_ACTION"
TXN_BY = "TXN_BY"
HALF_OFFSET = "HALF_OFFSET"

#: W3C trace context of a traced message (with MessageFlag.TRACED): the `traceparent`
#: and `tracestate` headers' values, under upper-case names like every system property.
TRACEPARENT = "TRACEPARENT"
TRACESTATE = "TRACESTATE"

#: Not a property: the index key the broker appends to a half message's keys (and puts on
#: its `%OP%` record), `TXN:<32 hex id>`, to find both by transaction id after a restart.
TXN_KEY_PREFIX = "TXN:"

SYSTEM_PROPERTIES = frozenset({DELIVER_AT_MS, TTL_MS, REAL_TOPIC, REAL_QUEUE_ID, ORIGIN_OFFSET,
                               ORIGIN_TOPIC, RECONSUME_TIMES, TXN_GROUP, CHECK_IMMUNITY_MS,
                               TXN_ID, TXN_ACTION, TXN_BY, HALF_OFFSET, TRACEPARENT,
                               TRACESTATE})

"""The delay hook: a DELAY-flagged message is stored in `%SCHEDULE%`, not in its topic.

The message keeps its id, tags, keys and properties; `REAL_TOPIC` and
`REAL_QUEUE_ID` say where it goes when due, `DELIVER_AT_MS` (set by the
producer) when. The delay scheduler reads `%SCHEDULE%` and re-sends it with
DELIVER_DUE at that time, so consumers of the real topic never see it early.
A delivery time already past is no delay: the message stays in its topic and
loses the flag. A delivery time beyond `max_delay_ms` from now is refused.
"""
from __future__ import annotations

import time

from ferry.codec import DELIVER_AT_MS, MessageFlag
from ferry.errors import InvalidDelayError
from ferry.names import SCHEDULE_TOPIC
from ferry.store import decode_properties

from ferry_broker.put_pipeline import PutBatch, PutHook, redirected
from ferry_broker.topics import TopicManager

_DELAY = int(MessageFlag.DELAY)


def schedule_queue(queue_id: int, schedule_queues: int) -> int:
    """The `%SCHEDULE%` queue of a message bound for `queue_id` of its topic."""
    return queue_id % schedule_queues


def deliver_at(props: dict[str, str], now_ms: int, max_delay_ms: int) -> int:
    """The message's delivery time from its properties; InvalidDelayError when unusable."""
    raw = props.get(DELIVER_AT_MS)
    if raw is None:
        raise InvalidDelayError(f"a DELAY message needs the {DELIVER_AT_MS} property")
    try:
        at_ms = int(raw)
    except ValueError:
        raise InvalidDelayError(f"{DELIVER_AT_MS} must be epoch milliseconds, not {raw!r}") from None
    if at_ms - now_ms > max_delay_ms:
        raise InvalidDelayError(
            f"delivery in {at_ms - now_ms} ms exceeds this broker's maximum delay of "
            f"{max_delay_ms} ms ({max_delay_ms / 86_400_000:g} days)")
    return at_ms


class DelayHook(PutHook):
    """Redirects DELAY-flagged messages to `%SCHEDULE%`."""

    def __init__(self, topics: TopicManager, max_delay_ms: int) -> None:
        self._topics = topics
        self._max_delay_ms = max_delay_ms

    def before_put(self, batch: PutBatch) -> None:
        msgs = batch.messages
        now_ms = int(time.time() * 1000)
        queues = 0
        for i, msg in enumerate(msgs):
            if not msg.flags & _DELAY:
                continue
            props = decode_properties(msg.properties)
            at_ms = deliver_at(props, now_ms, self._max_delay_ms)
            if at_ms <= now_ms:
                msgs[i] = msg._replace(flags=msg.flags & ~_DELAY)
                continue
            if not queues:  # registers %SCHEDULE% here, so that the scheduler finds it
                queues = self._topics.queues_for_send(SCHEDULE_TOPIC)
            msgs[i] = redirected(msg, props, SCHEDULE_TOPIC, schedule_queue(msg.queue_id, queues))

"""Decoding a PULL answer's body into `ConsumerRecord`s: the one decoder every reader of
a queue uses (the consumer's fetchers, the queue reader, DLQ and message queries)."""
from __future__ import annotations

from ferry.client.core.message import ConsumerRecord
from ferry.codec.record import (
    H_BODY_LEN,
    H_BORN_HOST_LEN,
    H_BORN_TS_MS,
    H_QUEUE_ID,
    H_QUEUE_OFFSET,
    H_RECONSUME_TIMES,
    H_STORE_HOST_LEN,
    H_STORE_TS_MS,
    H_TOPIC_LEN,
    H_TOTAL_SIZE,
    HEADER_SIZE,
    check_records,
)

_new_tuple = tuple.__new__


def decode_pull_body(body: bytes | bytearray | memoryview, topic: str,
                     broker: str) -> list[ConsumerRecord]:
    """The records of a PULL response body, checked (`check_records`) and decoded once.

    Only what every consumer needs is taken out eagerly (the body, positions,
    timestamps); the record keeps the stored header and the raw tags, keys and
    properties to decode on first use. The records all belong to the queue the
    PULL asked for, so the topic is the fetcher's own string.
    """
    if type(body) is not bytes:
        body = bytes(body)   # record bodies are handed out as bytes
    # The header's field indices, bound to locals for the loop.
    size_i, body_len_i = H_TOTAL_SIZE, H_BODY_LEN
    topic_i, born_i, store_i = H_TOPIC_LEN, H_BORN_HOST_LEN, H_STORE_HOST_LEN
    qid_i, qoff_i, born_ts_i, store_ts_i, reconsume_i = (
        H_QUEUE_ID, H_QUEUE_OFFSET, H_BORN_TS_MS, H_STORE_TS_MS, H_RECONSUME_TIMES)
    out: list[ConsumerRecord] = []
    add = out.append
    off = 0
    for h in check_records(memoryview(body), 0, len(body)):
        end = off + h[size_i]
        meta = off + HEADER_SIZE + h[topic_i] + h[born_i] + h[store_i]  # after topic and hosts
        payload = end - h[body_len_i]                                  # the body starts here
        # ConsumerRecord._make, inlined: this loop runs once per consumed message.
        add(_new_tuple(ConsumerRecord, (body[payload:end], topic, h[qid_i], h[qoff_i],
                                        h[born_ts_i], h[store_ts_i], h[reconsume_i], broker, h,
                                        body[meta:payload])))
        off = end
    return out

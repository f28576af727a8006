"""Every limit is one constant: each user imports it, and the layouts' length slots hold it."""
from __future__ import annotations

import struct

import ferry.wire as wire
from ferry.codec import limits, record
from ferry.routing import MAX_QUEUES
from ferry.store import StoreConfig
from ferry_broker.handlers import fields


def test_queue_ids_follow_the_queue_count() -> None:
    assert limits.MAX_QUEUES == MAX_QUEUES == 1024
    assert limits.MAX_QUEUE_ID == fields.MAX_QUEUE_ID == 1023


def test_the_wire_and_the_store_use_the_codec_limits() -> None:
    for name in ("MAX_BODY_BYTES", "MAX_TAGS_BYTES", "MAX_KEYS_BYTES", "MSG_ID_BYTES"):
        assert getattr(wire, name) == getattr(limits, name), name
    config = StoreConfig(root_dir="unused")
    assert config.max_message_bytes == limits.MAX_BODY_BYTES
    assert config.max_properties_bytes == limits.MAX_PROPERTIES_BYTES


def test_record_length_slots_hold_the_limits() -> None:
    codes = dict(record.HEADER_LAYOUT)

    def slot_max(field: str) -> int:
        return (1 << 8 * struct.calcsize("<" + codes[field])) - 1

    assert slot_max("topic_len") == limits.MAX_TOPIC_BYTES
    assert slot_max("born_host_len") == slot_max("store_host_len") == limits.MAX_HOST_BYTES
    assert slot_max("tags_len") == limits.MAX_TAGS_BYTES
    assert slot_max("keys_len") == limits.MAX_KEYS_BYTES
    assert slot_max("props_len") >= limits.MAX_PROPERTIES_BYTES
    assert codes["msg_id"] == f"{limits.MSG_ID_BYTES}s"
    assert slot_max("queue_id") // 2 >= limits.MAX_QUEUE_ID

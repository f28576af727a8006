"""Every size and count limit of a message, declared once.

The store, the wire, the clients and the broker's request checks all import
these; `docs/store-format.md` and `docs/protocol.md` state them and their tests
hold the pages to these values.
"""
from __future__ import annotations

#: Queues a topic may have on one broker, so queue ids run 0..MAX_QUEUE_ID.
MAX_QUEUES = 1024
MAX_QUEUE_ID = MAX_QUEUES - 1
#: A message id is 16 bytes (shown as 32 upper-case hex characters).
MSG_ID_BYTES = 16
#: The largest message body (the store's default `max_message_bytes`, the wire's limit).
MAX_BODY_BYTES = 4 * 1024 * 1024
#: Encoded properties are bounded apart from the body (RocketMQ allows 32 KiB).
MAX_PROPERTIES_BYTES = 0xFFFF
#: Tags and keys have u16 length fields in the SEND entry and the record.
MAX_TAGS_BYTES = 0xFFFF
MAX_KEYS_BYTES = 0xFFFF
#: A topic name and a host have u8 length fields in the record.
MAX_TOPIC_BYTES = 255
MAX_HOST_BYTES = 255

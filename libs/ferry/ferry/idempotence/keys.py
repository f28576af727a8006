"""The business key of a consumed message: what an idempotence check is keyed on."""
from __future__ import annotations

from typing import Any


def biz_key_of(record: Any) -> str:
    """The message key if the record has one, else its message id."""
    key = getattr(record, "key", None)
    return str(key) if key else str(record.msg_id)

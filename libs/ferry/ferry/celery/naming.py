"""kombu queue names → Ferry topic names, Celery's eta → a Ferry delivery time, kombu's
message priority → Ferry's, and the `redelivered` flag of a message that comes back.

Leaf helpers of the `ferry://` transport (no kombu or Celery import), so the
bridge and tests can use them too.
"""
from __future__ import annotations

import hashlib
import re
import time
from datetime import UTC, datetime
from typing import Any

from ferry.client.producing.encoding import DEFAULT_MAX_DELAY_MS

#: Room left under the 127-character name limit for the `celery-` group prefix.
MAX_TOPIC_CHARS = 120
_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_HASH_CHARS = 8
#: kombu's message priorities (virtual transports: 0..9, higher first, as on RabbitMQ).
KOMBU_MAX_PRIORITY = 9
#: Ferry's priority levels: a topic has 1..4 of them, `send(priority=0..3)`.
FERRY_PRIORITIES = 4


def topic_for_queue(queue: str) -> str:
    """The topic of kombu queue `queue`: the name itself when it is a valid topic name.

    Otherwise (Celery's `celeryev.<uuid>`, `host@name.celery.pidbox`, long names)
    each character outside [A-Za-z0-9_-] becomes `_` and 8 hex characters of the
    name's SHA-1 are appended, so two queue names never share a topic.
    """
    if not queue:
        raise ValueError("a kombu queue needs a name")
    if len(queue) <= MAX_TOPIC_CHARS and _BAD_CHARS.search(queue) is None:
        return queue
    digest = hashlib.sha1(queue.encode()).hexdigest()[:_HASH_CHARS]
    return f"{_BAD_CHARS.sub('_', queue)[:MAX_TOPIC_CHARS - _HASH_CHARS - 1]}-{digest}"


def is_reply_queue(queue: str) -> bool:
    """kombu's mailbox reply queue, `<oid>.reply.<namespace>.pidbox` (kombu.pidbox.Mailbox)."""
    return queue.endswith(".pidbox") and ".reply." in queue


def deliver_at_ms(headers: dict[str, Any] | None, *, now_ms: int | None = None,
                  max_delay_ms: int = DEFAULT_MAX_DELAY_MS) -> int | None:
    """When a Celery message with these headers should be delivered (epoch ms), or None for now.

    Celery's protocol 2 carries `countdown` / `eta` as an ISO 8601 `eta` header
    (naive means UTC, Celery's default). An eta beyond Ferry's longest delay is
    delivered at that limit and the worker holds it until due, as it does for
    any early eta task.
    """
    raw = (headers or {}).get("eta")
    if not raw:
        return None
    if isinstance(raw, datetime):
        eta = raw
    else:
        try:
            eta = datetime.fromisoformat(str(raw))
        except ValueError:
            return None   # Celery itself will reject the message's eta: deliver it now
    if eta.tzinfo is None:
        eta = eta.replace(tzinfo=UTC)
    due_ms = int(eta.timestamp() * 1000)
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    if due_ms <= now_ms:
        return None
    return min(due_ms, now_ms + max_delay_ms)


def mark_redelivered(payload: dict[str, Any]) -> None:
    """Flag a kombu message as redelivered where kombu and Celery read it.

    As kombu's Redis transport does when it restores a message: the
    `redelivered` header and `delivery_info['redelivered']` (a task's
    `request.delivery_info`, read by Celery's `deduplicate_successful_tasks`).
    """
    headers = payload.get("headers")
    if isinstance(headers, dict):
        headers["redelivered"] = True
    props = payload.get("properties")
    if isinstance(props, dict):
        info = props.get("delivery_info")
        if not isinstance(info, dict):
            info = props["delivery_info"] = {}
        info["redelivered"] = True


def ferry_priority(properties: dict[str, Any] | None) -> int:
    """Ferry's priority (0..3, 3 first) of a kombu message's `priority` (0..9, 9 first;
    clamped, missing or not a number: 0): 0-2 → 0, 3-4 → 1, 5-7 → 2, 8-9 → 3."""
    raw: Any = (properties or {}).get("priority")
    try:
        kombu_pri = min(max(int(raw), 0), KOMBU_MAX_PRIORITY)
    except (TypeError, ValueError):
        return 0
    return kombu_pri * FERRY_PRIORITIES // (KOMBU_MAX_PRIORITY + 1)

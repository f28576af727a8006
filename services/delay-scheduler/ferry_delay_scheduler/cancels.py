"""The cancel book: cancelled message ids, replicated in etcd so that failover keeps them.

A cancel is answered 200 only after `<prefix>delay/cancelled/<MSG_ID>` =
{"due_ms"} is written to etcd under a lease that ends `KEEP_AFTER_DUE_S` after
the message's due time (etcd then deletes it; a copy rolled or retried later
keeps its id and due time, so the key outlives it). A leader loads the whole
book when its term begins, before it delivers anything, and checks every
message against it when taking it over and again right before delivering it:
a cancelled message is never delivered by this leader or the next one.

Without etcd (a single instance, `FERRY_DELAY_SCHEDULER_ETCD` empty) the book
is held in memory only: there is no other instance to fail over to.
"""
from __future__ import annotations

import json
import logging
import time

from ferry.routing import EtcdRegistry

log = logging.getLogger(__name__)

CANCELLED_PREFIX = "delay/cancelled/"
#: How long a cancel is kept after its message's due time (a late copy still finds it).
KEEP_AFTER_DUE_S = 3600


class CancelBook:
    """The set of cancelled ids of this term, backed by etcd when there is one."""

    def __init__(self, registry: EtcdRegistry | None) -> None:
        self.registry = registry
        self._ids: dict[bytes, int] = {}  # msg id -> when the cancel may be forgotten (ms)

    def _key(self, msg_id: bytes) -> bytes:
        assert self.registry is not None
        return f"{self.registry.prefix}{CANCELLED_PREFIX}{msg_id.hex().upper()}".encode()

    async def load(self) -> int:
        """Read every cancel from etcd (a new term, before delivering); how many."""
        if self.registry is None:
            self._forget_expired()
            return len(self._ids)
        prefix = f"{self.registry.prefix}{CANCELLED_PREFIX}".encode()
        ids: dict[bytes, int] = {}
        for kv in await self.registry.client.get_prefix(prefix):
            try:
                ids[bytes.fromhex(kv.key[len(prefix):].decode())] = _keep_until(
                    int(json.loads(kv.value)["due_ms"]))
            except (ValueError, KeyError, TypeError):
                log.warning("ignoring a malformed cancel at %r", kv.key)
        self._ids = ids  # etcd has every cancel (its leases dropped the expired ones)
        return len(ids)

    async def add(self, msg_id: bytes, due_ms: int) -> None:
        """Record the cancel durably (replicated) before the caller answers it."""
        if self.registry is not None:
            client = self.registry.client
            ttl = max(0, due_ms - int(time.time() * 1000)) // 1000 + KEEP_AFTER_DUE_S
            lease = await client.lease(ttl)
            await client.put(self._key(msg_id), json.dumps({"due_ms": due_ms}).encode(),
                             lease=lease)
        self._ids[msg_id] = _keep_until(due_ms)
        if len(self._ids) % 1024 == 0:
            self._forget_expired()

    def contains(self, msg_id: bytes) -> bool:
        return msg_id in self._ids

    def _forget_expired(self) -> None:
        now = int(time.time() * 1000)
        self._ids = {k: until for k, until in self._ids.items() if until > now}


def _keep_until(due_ms: int) -> int:
    return due_ms + KEEP_AFTER_DUE_S * 1000

"""Connection admission and refusal counters shared by every Ferry server.

The broker's wire server (`ferry_broker.limits`) and every HTTP API
(`ferry.service.limits`) admit a connection only under two limits, connections in
all and per client address, and count each refusal by kind for their
`/v1/stats` `limits` section. A refusal is logged at most once a second per
kind, with its count: a flood must not fill the disk with logs.

No asyncio and no network here: the servers call `admit` and `release` from
their own connection callbacks.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable

#: A refusal is logged at most this often per kind.
LOG_EVERY_S = 1.0

CONNECTIONS_OVER_TOTAL = "connections_over_total"
CONNECTIONS_OVER_PER_ADDR = "connections_over_per_addr"


class Admission:
    """Connections held in total and per client address, and the refusals counted by kind."""

    def __init__(self, max_connections: int, max_connections_per_addr: int,
                 counters: Iterable[str], log: logging.Logger) -> None:
        self.max_connections = max_connections
        self.max_connections_per_addr = max_connections_per_addr
        self.counts: Counter[str] = Counter({name: 0 for name in counters})
        self._log = log
        self._per_addr: dict[str, int] = {}
        self._open = 0
        self._logged_at: dict[str, float] = {}

    @property
    def open_connections(self) -> int:
        return self._open

    @property
    def client_addresses(self) -> int:
        """How many client addresses hold a connection now."""
        return len(self._per_addr)

    def admit(self, host: str) -> str | None:
        """Take a connection from `host`; None if admitted, else the counter that refused it."""
        if self._open >= self.max_connections:
            return CONNECTIONS_OVER_TOTAL
        held = self._per_addr.get(host, 0)
        if held >= self.max_connections_per_addr:
            return CONNECTIONS_OVER_PER_ADDR
        self._per_addr[host] = held + 1
        self._open += 1
        return None

    def release(self, host: str) -> None:
        """An admitted connection from `host` closed."""
        self._open -= 1
        left = self._per_addr.get(host, 0) - 1
        if left > 0:
            self._per_addr[host] = left
        else:
            self._per_addr.pop(host, None)

    def count(self, why: str) -> None:
        """Count an event that is not logged (a pause, a parse error counted elsewhere)."""
        self.counts[why] += 1

    def refuse(self, why: str, message: str, *args: object) -> None:
        """Count a refusal and log it, at most once a second per kind (with the count)."""
        self.counts[why] += 1
        now = time.monotonic()
        if now - self._logged_at.get(why, 0.0) >= LOG_EVERY_S:
            self._logged_at[why] = now
            self._log.warning(message + " (%s: %d so far)", *args, why, self.counts[why])

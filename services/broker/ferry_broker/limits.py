"""The wire server's limits against exhaustion, and the count of every time one was hit.

Each limit is a `BrokerConfig` field (docs/security.md, "Limits", has the
table): connections in total and per client address (`admit`), the frame size
(the decoder refuses a larger frame from its first 4 bytes, before buffering
it), requests running per connection and unwritten response bytes per
connection (reading pauses: TCP pushes back on the client), and parked pulls
(`long_poll.py`, BusyError). `WireLimits` decides the connection limits and
keeps the counters that `/v1/stats` shows under `limits`, so an operator sees
who is being refused and why.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from ferry.wire.codes import MAX_HEADER_BYTES

from ferry_broker.config import BrokerConfig

log = logging.getLogger(__name__)

#: A refusal is logged at most this often per kind: a flood must not fill the disk with logs.
LOG_EVERY_S = 1.0

# The counters /v1/stats shows (each also a `why` of `refuse`).
CONNECTIONS_OVER_TOTAL = "connections_over_total"
CONNECTIONS_OVER_PER_ADDR = "connections_over_per_addr"
FRAMES_MALFORMED = "frames_malformed"
RESPONSES_IGNORED = "responses_ignored"  # a client sent a response frame: dropped
READING_PAUSED_INFLIGHT = "reading_paused_inflight"
READING_PAUSED_UNWRITTEN = "reading_paused_unwritten"
HELD_PULLS_OVER_PER_CONN = "held_pulls_over_per_conn"
HELD_PULLS_OVER_TOTAL = "held_pulls_over_total"
COUNTERS = (CONNECTIONS_OVER_TOTAL, CONNECTIONS_OVER_PER_ADDR, FRAMES_MALFORMED, RESPONSES_IGNORED,
            READING_PAUSED_INFLIGHT, READING_PAUSED_UNWRITTEN, HELD_PULLS_OVER_PER_CONN,
            HELD_PULLS_OVER_TOTAL)


class WireLimits:
    """Connection admission per address and in total, and the refusal counters."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        self.counts: Counter[str] = Counter({name: 0 for name in COUNTERS})
        self._per_addr: dict[str, int] = {}
        self._open = 0
        self._logged_at: dict[str, float] = {}

    @property
    def open_connections(self) -> int:
        return self._open

    def admit(self, host: str) -> str | None:
        """Take a connection from `host`; None if admitted, else the counter it was refused by."""
        if self._open >= self.config.max_connections:
            return CONNECTIONS_OVER_TOTAL
        held = self._per_addr.get(host, 0)
        if held >= self.config.max_connections_per_addr:
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
        self.counts[why] += 1

    def refuse(self, why: str, message: str, *args: object) -> None:
        """Count a refusal and log it, at most once a second per kind (with the count)."""
        self.counts[why] += 1
        now = time.monotonic()
        if now - self._logged_at.get(why, 0.0) >= LOG_EVERY_S:
            self._logged_at[why] = now
            log.warning(message + " (%s: %d so far)", *args, why, self.counts[why])

    def as_json(self) -> dict[str, Any]:
        """The `limits` section of /v1/stats: the settings, what is in use, the refusals."""
        cfg = self.config
        return {
            "settings": {
                "max_connections": cfg.max_connections,
                "max_connections_per_addr": cfg.max_connections_per_addr,
                "max_frame_bytes": cfg.max_frame_bytes,
                "max_header_bytes": MAX_HEADER_BYTES,
                "max_inflight_per_conn": cfg.max_inflight_per_conn,
                "max_unwritten_bytes_per_conn": cfg.max_unwritten_bytes_per_conn,
                "max_held_pulls_per_conn": cfg.max_held_pulls_per_conn,
                "max_held_pulls": cfg.max_held_pulls,
            },
            "connections": self._open,
            "client_addresses": len(self._per_addr),
            "counts": dict(self.counts),
        }

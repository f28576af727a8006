"""The wire server's limits against exhaustion, and the count of every time one was hit.

Each limit is a `BrokerConfig` field (docs/security.md, "Limits", has the
table): connections in total and per client address (`admit`), the frame size
(the decoder refuses a larger frame from its first 4 bytes, before buffering
it), requests running per connection and unwritten response bytes per
connection (reading pauses: TCP pushes back on the client), parked pulls
(`long_poll.py`, BusyError), and the time a connection may stay idle (the server's
sweep closes it). `WireLimits` decides the connection limits and
keeps the counters that `/v1/stats` shows under `limits`, so an operator sees
who is being refused and why.
"""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Any, Protocol

from ferry.service.admission import CONNECTIONS_OVER_PER_ADDR, CONNECTIONS_OVER_TOTAL, Admission
from ferry.wire.codes import MAX_HEADER_BYTES

from ferry_broker.config import BrokerConfig

log = logging.getLogger(__name__)

# The counters /v1/stats shows (each also a `why` of `refuse`); the two connection
# counters are ferry.service.admission's.
FRAMES_MALFORMED = "frames_malformed"
RESPONSES_IGNORED = "responses_ignored"  # a client sent a response frame: dropped
READING_PAUSED_INFLIGHT = "reading_paused_inflight"
READING_PAUSED_UNWRITTEN = "reading_paused_unwritten"
HELD_PULLS_OVER_PER_CONN = "held_pulls_over_per_conn"
HELD_PULLS_OVER_TOTAL = "held_pulls_over_total"
PENDING_FRAMES_WAITED = "pending_frames_waited"  # a large frame waited for the budget
FRAMES_TOO_SLOW = "frames_too_slow"  # a large frame did not arrive within frame_timeout_ms
CONNECTIONS_IDLE = "connections_idle"  # no frame completed within idle_timeout_ms: closed
COUNTERS = (CONNECTIONS_OVER_TOTAL, CONNECTIONS_OVER_PER_ADDR, FRAMES_MALFORMED, RESPONSES_IGNORED,
            READING_PAUSED_INFLIGHT, READING_PAUSED_UNWRITTEN, HELD_PULLS_OVER_PER_CONN,
            HELD_PULLS_OVER_TOTAL, PENDING_FRAMES_WAITED, FRAMES_TOO_SLOW, CONNECTIONS_IDLE)
#: Incomplete frames up to this size do not draw on the pending-frame budget: the bytes
#: they can hold are bounded by connections x this, and requests stay cheap.
SMALL_FRAME_BYTES = 64 * 1024


class Waiter(Protocol):
    """A connection waiting for room in the pending-frame budget."""

    def budget_granted(self, reserved: int) -> None: ...


class PendingFrameBudget:
    """The bytes that incomplete large frames may claim at once, over all connections.

    A connection whose next frame (over SMALL_FRAME_BYTES) has begun to arrive
    reserves the frame's announced size; when the budget has no room, its reading
    pauses and it waits in line (FIFO) until completed frames give room back. The
    holders are never paused for it, so they finish and free room; a holder that does
    not finish within `frame_timeout_ms` is closed by the server's sweep.
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self.reserved = 0
        self._waiting: OrderedDict[Waiter, int] = OrderedDict()

    def take(self, n: int) -> bool:
        """Reserve `n` bytes now if there is room and nobody waits before."""
        if self._waiting or self.reserved + n > self.budget_bytes:
            return False
        self.reserved += n
        return True

    def wait(self, waiter: Waiter, n: int) -> None:
        self._waiting[waiter] = n

    def forget(self, waiter: Waiter) -> None:
        self._waiting.pop(waiter, None)

    def give(self, n: int) -> None:
        """Return `n` reserved bytes and grant waiters in turn while they fit."""
        self.reserved -= n
        while self._waiting:
            waiter, need = next(iter(self._waiting.items()))
            if self.reserved + need > self.budget_bytes:
                return
            del self._waiting[waiter]
            self.reserved += need
            waiter.budget_granted(need)

    @property
    def waiting(self) -> int:
        return len(self._waiting)


class WireLimits(Admission):
    """The wire server's limits: connection admission and refusal counters (ferry.service.admission)
    plus the pending-frame budget."""

    def __init__(self, config: BrokerConfig) -> None:
        super().__init__(config.max_connections, config.max_connections_per_addr, COUNTERS, log)
        self.config = config
        self.pending = PendingFrameBudget(config.max_pending_frame_bytes)

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
                "max_pending_frame_bytes": cfg.max_pending_frame_bytes,
                "frame_timeout_ms": cfg.frame_timeout_ms,
                "idle_timeout_ms": cfg.idle_timeout_ms,
            },
            "connections": self.open_connections,
            "pending_frame_bytes": self.pending.reserved,
            "waiting_for_pending_budget": self.pending.waiting,
            "client_addresses": self.client_addresses,
            "counts": dict(self.counts),
        }

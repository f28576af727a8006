"""Cancelling a pending delayed message (POST /v1/delayed/{msg_id}/cancel).

The message is found through the local store's id index (no id map in
memory). Pending: a CANCELLED journal entry is fdatasync'd before the answer,
so it is never delivered, even after a crash. Delivered: AlreadyDeliveredError
(21) saying when. Being delivered right now: the answer waits for that frame's
outcome. Not found: the leader waits up to `cancel_wait_ms` for its pull loop
to take the message over (a cancel may follow the send closely), then
MessageNotFoundError (12); a standby that does not hold it answers
NotLeaderError (503) naming the leader.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from ferry.errors import (
    AlreadyDeliveredError,
    BusyError,
    MalformedRequestError,
    MessageNotFoundError,
)

from ferry_delay_scheduler.local_log import LocalLog, record_due
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.wheel import TimingWheel, now_ms
from ferry_delay_scheduler.wheel_files import EntryState

MSG_ID_HEX_CHARS = 32
POLL_S = 0.05


class NotLeaderError(BusyError):
    """A standby does not hold the message: ask the leader (`leader` is its HTTP address)."""

    def __init__(self, message: str, leader: str) -> None:
        super().__init__(message)
        self.leader = leader


def parse_msg_id(text: str) -> bytes:
    if len(text) != MSG_ID_HEX_CHARS:
        raise MalformedRequestError(f"msg_id must be {MSG_ID_HEX_CHARS} hex characters")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise MalformedRequestError("msg_id must be hexadecimal") from None


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


class Canceller:
    def __init__(self, local: LocalLog, wheel: TimingWheel, stats: Stats,
                 is_leader: Callable[[], bool], leader_addr: Callable[[], str],
                 wait_ms: int, inflight_wait_ms: int) -> None:
        self.local = local
        self.wheel = wheel
        self.stats = stats
        self.is_leader = is_leader
        self.leader_addr = leader_addr
        self.wait_ms = wait_ms
        self.inflight_wait_ms = inflight_wait_ms

    async def cancel(self, msg_id_hex: str) -> dict[str, object]:
        msg_id = parse_msg_id(msg_id_hex)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_ms / 1000
        while True:
            found = self.local.find(msg_id)
            if found:
                break
            if not self.is_leader():
                raise NotLeaderError(f"message {msg_id_hex} is not held here; ask the leader",
                                     self.leader_addr())
            if loop.time() >= deadline:
                raise MessageNotFoundError(f"no delayed message with id {msg_id_hex}")
            await asyncio.sleep(POLL_S)
        rec = found[0]
        # The copy the cancel names must be durable first: one lost in a power cut would
        # be pulled again from the broker as a new copy that this cancel does not name.
        await self.local.durable(rec.end_offset)
        due = record_due(rec)
        deadline = loop.time() + self.inflight_wait_ms / 1000
        while True:
            outcome = self.wheel.cancel(due, rec.store_ts_ms, rec.phy_offset, now_ms())
            if outcome.state != EntryState.SENDING:
                break
            if loop.time() >= deadline:
                raise BusyError(f"message {msg_id_hex} is being delivered; ask again")
            await asyncio.sleep(POLL_S)
        if outcome.state == EntryState.DELIVERED:
            when = f" at {_iso(outcome.time_ms)}" if outcome.time_ms else ""
            raise AlreadyDeliveredError(f"message {msg_id_hex} was already delivered{when} "
                                        f"(due at {_iso(due)})")
        if outcome.changed:
            self.stats.cancelled += 1
        return {"msg_id": msg_id_hex.upper(), "cancelled": True, "due_ms": due}

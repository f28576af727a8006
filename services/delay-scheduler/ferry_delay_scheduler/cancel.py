"""Cancelling a pending delayed message (POST /v1/delayed/{msg_id}/cancel).

Only the leader answers (a standby answers NotLeaderError, 503, naming the
leader). The message is found through the term's local store id index (no id
map in memory). Pending: the cancel is written to the replicated cancel book
(cancels.py, etcd) first, then journaled CANCELLED, then answered 200: neither
this leader nor the next one delivers it. Delivered: AlreadyDeliveredError
(21) saying when. Being delivered right now: the answer waits for that frame's
outcome. Not found: the leader waits up to `cancel_wait_ms` for its pull loop
to take the message over (a cancel may follow the send closely), then
MessageNotFoundError (12).
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

from ferry_delay_scheduler.cancels import CancelBook
from ferry_delay_scheduler.local_log import record_due
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.term import Term
from ferry_delay_scheduler.wheel import CancelOutcome, now_ms
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
    def __init__(self, term: Callable[[], Term | None], cancels: CancelBook, stats: Stats,
                 is_leader: Callable[[], bool], leader_addr: Callable[[], str], wait_ms: int,
                 inflight_wait_ms: int) -> None:
        self.term = term  # the current term while this instance leads, else None
        self.is_leader = is_leader
        self.cancels = cancels
        self.stats = stats
        self.leader_addr = leader_addr
        self.wait_ms = wait_ms
        self.inflight_wait_ms = inflight_wait_ms

    def _leading_term(self, msg_id_hex: str, starting_ok: bool = False) -> Term | None:
        term = self.term()
        if term is None and starting_ok and self.is_leader():
            return None  # elected, its term is starting
        if term is None or not term.leads():
            raise NotLeaderError(f"message {msg_id_hex} is not held here; ask the leader",
                                 self.leader_addr())
        return term

    async def cancel(self, msg_id_hex: str) -> dict[str, object]:
        msg_id = parse_msg_id(msg_id_hex)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_ms / 1000
        while True:
            current = self._leading_term(msg_id_hex, starting_ok=True)
            found = current.local.find(msg_id) if current is not None else []
            if found and current is not None:
                term = current
                break
            if loop.time() >= deadline:
                raise MessageNotFoundError(f"no delayed message with id {msg_id_hex}")
            await asyncio.sleep(POLL_S)
        rec = found[0]
        due = record_due(rec)
        stored, phy = rec.store_ts_ms, rec.phy_offset
        settled = await self._settled(term, msg_id_hex, due, stored, phy)
        if settled is None or settled.state != EntryState.DELIVERED:
            # Replicated first: the next leader never delivers it either. A copy
            # rolled or cancelled before is cancelled again (the book is keyed by id).
            await self.cancels.add(msg_id, due)
            if self._leading_term(msg_id_hex) is term:
                outcome = term.wheel.cancel(due, stored, phy, now_ms())
                if outcome.changed:
                    term.low.settle([phy])
                    self.stats.cancelled += 1
                if outcome.state == EntryState.SENDING:  # sent meanwhile: its outcome decides
                    settled = await self._settled(term, msg_id_hex, due, stored, phy)
        if settled is not None and settled.state == EntryState.DELIVERED:
            when = f" at {_iso(settled.time_ms)}" if settled.time_ms else ""
            raise AlreadyDeliveredError(f"message {msg_id_hex} was already delivered{when} "
                                        f"(due at {_iso(due)})")
        return {"msg_id": msg_id_hex.upper(), "cancelled": True, "due_ms": due}

    async def _settled(self, term: Term, msg_id_hex: str, due: int, stored: int,
                       phy: int) -> CancelOutcome | None:
        """The message's final state in this term (waiting out a frame in flight)."""
        deadline = asyncio.get_running_loop().time() + self.inflight_wait_ms / 1000
        while True:
            state = term.wheel.state_of(due, stored, phy)
            if state is None or state.state != EntryState.SENDING:
                return state
            if asyncio.get_running_loop().time() >= deadline:
                raise BusyError(f"message {msg_id_hex} is being delivered; ask again")
            await asyncio.sleep(POLL_S)

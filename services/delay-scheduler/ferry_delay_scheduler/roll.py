"""Rolling: long-pending records are stored again in %SCHEDULE%, so that marks keep moving.

The low-water mark of a queue (progress.py) cannot pass a pending record: one
message due in 30 days would pin it, with the brokers' retention of
%SCHEDULE% and what a new leader must read again. So on each upkeep round,
per queue, the unsettled records taken more than `roll_after_ms` ago whose
due time is not near (beyond the wheel's window plus `ROLL_MARGIN_MS`) are
sent back to the broker they came from with DELIVER_DUE `roll: true`
(docs/protocol.md): the broker stores each again in %SCHEDULE% (replicated,
same id, same DELIVER_AT_MS). Only once the broker acknowledged the copy is
the old one settled (journaled here, and no longer pinning its mark); the
copy is taken over like any new record. A crash between the two leaves both
copies: at-least-once, never a loss. A message is rolled about once per
`roll_after_ms` over its delay; that is the write cost of a bounded failover.
"""
from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable

from ferry.client.core.connection import ConnectionPool
from ferry.codec import REAL_QUEUE_ID, REAL_TOPIC, StoredMessage
from ferry.errors import CorruptRecordError, FerryError, StoreError
from ferry.wire import RequestCode, WireMessage, encode_messages

from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.local_log import LocalLog, record_due
from ferry_delay_scheduler.progress import LowWater
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.wheel import TimingWheel, now_ms
from ferry_delay_scheduler.wheel_files import EntryState

log = logging.getLogger(__name__)

ROLL_BATCH = 1000  # records rolled per queue per round at most
ROLL_MARGIN_MS = 10_000  # a record due within the window plus this is left to be delivered


class Roller:
    """Rolls the old pending records of every queue mark (see the module doc)."""

    def __init__(self, cfg: SchedulerConfig, pool: ConnectionPool, local: LocalLog,
                 wheel: TimingWheel, low: LowWater, stats: Stats,
                 brokers: Callable[[], dict[str, str]], leads: Callable[[], bool]) -> None:
        self.cfg, self.pool, self.local, self.wheel = cfg, pool, local, wheel
        self.low, self.stats, self.brokers, self.leads = low, stats, brokers, leads

    async def roll(self) -> None:
        now = now_ms()
        for mark in list(self.low.marks.values()):
            phys = self.low.old_pending(mark, now - self.cfg.roll_after_ms, ROLL_BATCH)
            addr = self.brokers().get(mark.broker)
            if not phys or not addr:
                continue
            groups: dict[tuple[str, int], list[tuple[int, StoredMessage]]] = defaultdict(list)
            for phy in phys:
                rec = self._read(phy)
                if rec is None or record_due(rec) <= now + self.cfg.window_ms + ROLL_MARGIN_MS:
                    continue
                try:
                    qid = int(rec.properties.get(REAL_QUEUE_ID, "-1"))
                except ValueError:
                    qid = -1
                groups[(rec.properties.get(REAL_TOPIC, ""), qid)].append((phy, rec))
            for (topic, qid), recs in groups.items():
                if not self.leads():  # the fence, before each frame as the deliverer does
                    return
                await self._roll(addr, topic, qid, recs)

    def _read(self, phy: int) -> StoredMessage | None:
        if self.wheel.in_flight(phy):
            return None
        try:
            return self.local.read(phy)
        except (StoreError, CorruptRecordError):
            return None  # tried again next round; delivery reports a lost record

    async def _roll(self, addr: str, topic: str, qid: int,
                    recs: list[tuple[int, StoredMessage]]) -> None:
        msgs = [WireMessage(r.body, r.msg_id, r.born_ts_ms, r.flags, r.tags, r.keys,
                            r.properties_raw) for _, r in recs]
        try:
            await self.pool.request(addr, RequestCode.DELIVER_DUE,
                                    {"topic": topic, "queue_id": qid, "roll": True},
                                    encode_messages(msgs), timeout_ms=self.cfg.deliver_timeout_ms)
        except FerryError as exc:
            log.warning("rolling %d records to %s failed (%s); next round", len(recs), addr, exc)
            return
        at = now_ms()
        settled = []
        for phy, rec in recs:
            outcome = self.wheel.cancel(record_due(rec), rec.store_ts_ms, phy, at)
            if outcome.state != EntryState.SENDING:
                settled.append(phy)
        self.low.settle(settled)
        self.stats.rolled += len(recs)

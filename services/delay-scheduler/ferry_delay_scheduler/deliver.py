"""Delivering due messages: DELIVER_DUE to the broker they came from, in large batches.

The loop loads the wheel's window, takes every message due now, reads each
from the local log, groups them by (broker, real topic, real queue) and sends
each group as DELIVER_DUE frames of up to `deliver_batch_messages` messages
and `deliver_batch_bytes`, `deliver_inflight_frames` at a time. Each message
keeps its id, born time, tags, keys and properties (plus ORIGIN_OFFSET and
RECONSUME_TIMES, added when it was taken over); its flags lose DELAY. A
TRACED message gets a `deliver` span around its frame's request (tracing.py).

Before a frame leaves, its messages are journaled SENDING; on the broker's
answer, DELIVERED. A frame that fails goes to another master of the real
topic's route (queue -1: the broker picks), and failing that is retried with
back-off: a message is never dropped.

Only the leader delivers, and it checks right before handing out due messages
and again right before each frame leaves that it still may act as leader
(`leads`: its lease was refreshed less than 2/3 of the TTL ago, see leader.py),
and that no message of the frame is in the cancel book. Each acknowledged,
cancelled or lost message is settled in the low-water marks (progress.py).
"""
from __future__ import annotations

import asyncio
import logging
from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack

from ferry.client.core.connection import ConnectionPool
from ferry.client.core.namesrv import NamesrvClient
from ferry.client.reading import route_or_none
from ferry.codec import ORIGIN_OFFSET, REAL_QUEUE_ID, REAL_TOPIC, MessageFlag, StoredMessage
from ferry.errors import CorruptRecordError, FerryError, StoreError
from ferry.tasks import repeat
from ferry.wire import RequestCode, WireMessage, encode_messages

from ferry_delay_scheduler.cancels import CancelBook
from ferry_delay_scheduler.config import SchedulerConfig
from ferry_delay_scheduler.local_log import LocalLog, parse_origin
from ferry_delay_scheduler.stats import Stats
from ferry_delay_scheduler.tracing import TRACED, deliver_spans, failed
from ferry_delay_scheduler.wheel import Due, TimingWheel, now_ms

log = logging.getLogger(__name__)

IDLE_SLEEP_S = 0.05  # the longest nap while nothing is due (new arrivals may be due sooner)
# While nothing is due, messages due within PREPARE_AHEAD_MS are read from the local log and
# built into SEND entries in advance (at most PREPARE_PER_TURN per turn, MAX_PREPARED held),
# so that a burst due in one second costs only the sends when it comes: reading and decoding
# is ~7 us a message, 0.7 s for 100,000 (measured on the 2-core dev machine).
PREPARE_AHEAD_MS = 2000
PREPARE_STEP_MS = 100  # rescan the heap only when this much new time entered the horizon
PREPARE_PER_TURN = 5000
MAX_PREPARED = 200_000
MAX_BACKOFF_MS = 60_000
ERROR_PAUSE_S = 1.0
_NOT_DELAY = ~int(MessageFlag.DELAY) & 0xFFFF_FFFF

Target = tuple[str, str, int]  # (broker name, real topic, real queue id)


class Deliverer:
    """Hands due messages to brokers while this instance leads (docs/delay.md, Failover)."""

    def __init__(self, cfg: SchedulerConfig, wheel: TimingWheel, local: LocalLog,
                 pool: ConnectionPool, namesrv: NamesrvClient, stats: Stats,
                 brokers: Callable[[], dict[str, str]], *, leads: Callable[[], bool],
                 cancels: CancelBook, settle: Callable[[list[int]], None]) -> None:
        self.cfg = cfg
        self.leads = leads  # the fence: False once this instance may no longer act as leader
        self.cancels = cancels
        self.settle = settle
        self.wheel = wheel
        self.local = local
        self.pool = pool
        self.namesrv = namesrv
        self.stats = stats
        self.brokers = brokers
        self._slots = asyncio.Semaphore(cfg.deliver_inflight_frames)
        self._sends: set[asyncio.Task[None]] = set()
        self._failures: dict[int, int] = {}  # phy -> failed attempts, for the back-off
        self._prepared: dict[int, tuple[Target, WireMessage]] = {}  # phy -> built in advance
        self._prepared_until = 0  # the horizon of the last complete prefetch scan
        self._prepared_version = -1  # the wheel's version at that scan
        #: Set when messages join the wheel, so that one due at once does not wait a nap.
        self.wake = asyncio.Event()

    async def run(self) -> None:
        # A failed turn (a failed local log) is logged; the loop goes on.
        await repeat(self._turn, log, "delivery turn", error_pause_s=ERROR_PAUSE_S)

    async def _turn(self) -> None:
        """Hand out what is due now, or prepare what comes next and nap until it does."""
        now = now_ms()
        self.wheel.advance(now)
        if not self.leads():
            await asyncio.sleep(IDLE_SLEEP_S)  # deposed: the term ends soon, hand out nothing
            return
        # One frame's worth per turn: the first frame leaves before the rest is read.
        due = self.wheel.pop_due(now, self.cfg.deliver_batch_messages)
        if due:
            await self._dispatch(due)
            await asyncio.sleep(0)
            return
        self._prepare_ahead(now)
        nxt = self.wheel.next_ready_ms()
        wait_s = IDLE_SLEEP_S if nxt is None else min(IDLE_SLEEP_S, max(0, nxt - now) / 1000)
        self.wake.clear()
        try:
            await asyncio.wait_for(self.wake.wait(), wait_s)
        except TimeoutError:
            pass

    def _prepare_ahead(self, now: int) -> None:
        horizon = now + PREPARE_AHEAD_MS
        if (self.wheel.version == self._prepared_version
                and horizon - self._prepared_until < PREPARE_STEP_MS):
            return  # nothing new since the last full scan: do not walk the heap again
        if len(self._prepared) >= MAX_PREPARED:
            self._prepared.clear()  # a cache: entries of cancelled messages would stay forever
        version = self.wheel.version
        done = 0
        for _, phy in self.wheel.upcoming(horizon):
            if phy in self._prepared:
                continue
            rec = self.local.read(phy)
            if rec is not None:  # a record that cannot be read is handled when due
                self._prepared[phy] = _build(rec)
            done += 1
            if done >= PREPARE_PER_TURN:
                return
        self._prepared_until, self._prepared_version = horizon, version

    async def _dispatch(self, due: list[Due]) -> None:
        groups: dict[Target, list[tuple[Due, WireMessage]]] = defaultdict(list)
        prepared = self._prepared
        dropped: list[Due] = []
        for item in due:
            built = prepared.pop(item.phy_offset, None)
            if built is None:
                rec = self._read(item)
                if rec is None:
                    continue
                built = _build(rec)
            if self.cancels.contains(built[1].msg_id):
                dropped.append(item)
                continue
            groups[built[0]].append((item, built[1]))
        if dropped:  # cancelled (maybe by the previous leader): never sent
            self.wheel.mark_cancelled(dropped, now_ms())
            self.settle([item.phy_offset for item in dropped])
        for target, entries in groups.items():
            for chunk in self._chunks(entries):
                await self._slots.acquire()
                task = asyncio.create_task(self._send(target, chunk))
                self._sends.add(task)
                task.add_done_callback(self._sends.discard)

    def _read(self, item: Due) -> StoredMessage | None:
        try:
            rec = self.local.read(item.phy_offset)
        except (StoreError, CorruptRecordError) as exc:
            # The local log failed to answer (an I/O error, closing): not a verdict on
            # the record. Try again later; never settle a message on a failed read.
            log.warning("cannot read local offset %d (%s); retrying", item.phy_offset, exc)
            self.wheel.retry([item], now_ms() + self.cfg.retry_backoff_ms)
            return None
        if rec is None:
            # No valid record there: only a damaged or expired local log gets here. Say
            # so loudly, count it, and settle the entry so that its bucket can close.
            log.error("message at local offset %d cannot be read; it is lost", item.phy_offset)
            self.stats.missing_records += 1
            self.wheel.mark_delivered([item], now_ms())
            self.settle([item.phy_offset])
        return rec

    def _chunks(self, entries: list[tuple[Due, WireMessage]]
                ) -> list[list[tuple[Due, WireMessage]]]:
        out: list[list[tuple[Due, WireMessage]]] = []
        cur: list[tuple[Due, WireMessage]] = []
        size = 0
        for entry in entries:
            msg = entry[1]
            n = 44 + len(msg.body) + len(msg.properties) + len(msg.tags) + len(msg.keys)
            if cur and (len(cur) >= self.cfg.deliver_batch_messages
                        or size + n > self.cfg.deliver_batch_bytes):
                out.append(cur)
                cur, size = [], 0
            cur.append(entry)
            size += n
        if cur:
            out.append(cur)
        return out

    async def _send(self, target: Target, chunk: list[tuple[Due, WireMessage]]) -> None:
        items = [item for item, _ in chunk]
        try:
            if not self.leads():  # the fence, right before the frame leaves
                self.wheel.retry(items, now_ms() + self.cfg.retry_backoff_ms)
                return
            self.wheel.mark_sending(items, now_ms())
            msgs = [msg for _, msg in chunk]
            flags = 0
            for msg in msgs:
                flags |= msg.flags
            with ExitStack() as stack:
                spans = []
                if flags & TRACED:  # deliver spans (see tracing.py); replaces traced entries
                    spans = deliver_spans(stack, msgs, target[1], target[2], target[0],
                                          self.cfg.node_id)
                try:
                    await self._deliver(target, encode_messages(msgs), flags)
                except (FerryError, OSError) as exc:
                    failed(spans, exc)
                    self._failed(target, items, exc)
                    return
            acked = now_ms()
            dups = self.wheel.mark_delivered(items, acked)
            self.settle([item.phy_offset for item in items])
            self.stats.delivered += len(items)
            self.stats.duplicates_after_crash += dups
            for item in items:
                self.stats.lateness.add(acked - item.due_ms)
                self._failures.pop(item.phy_offset, None)
        except Exception as exc:  # a bug must not strand these messages in flight
            log.exception("delivery to %s failed unexpectedly", target)
            self._failed(target, items, exc)
        finally:
            self._slots.release()

    async def _deliver(self, target: Target, body: bytes, flags: int) -> None:
        broker, topic, qid = target
        fields = {"topic": topic, "queue_id": qid, "flags": flags or None}
        addr = self.brokers().get(broker)
        first_error: Exception | None = None
        if addr:
            try:
                await self.pool.request(addr, RequestCode.DELIVER_DUE, fields, body,
                                        timeout_ms=self.cfg.deliver_timeout_ms)
                return
            except FerryError as exc:
                if not getattr(exc, "retriable", False):
                    raise
                first_error = exc
        # The broker it came from is gone or refuses: any master of the real topic.
        route = await route_or_none(self.namesrv, topic)
        masters = [b.master for b in route.brokers if b.master and b.writable] if route else []
        for other in masters:
            if other == addr:
                continue
            try:
                await self.pool.request(other, RequestCode.DELIVER_DUE,
                                        {**fields, "queue_id": -1}, body,
                                        timeout_ms=self.cfg.deliver_timeout_ms)
                return
            except FerryError as exc:
                first_error = first_error or exc
        raise first_error or FerryError(f"no broker to deliver {topic!r} to")

    def _failed(self, target: Target, items: list[Due], exc: BaseException) -> None:
        self.stats.delivery_errors += 1
        attempts = max(self._failures.get(item.phy_offset, 0) for item in items) + 1
        for item in items:
            self._failures[item.phy_offset] = attempts
        backoff_ms = min(self.cfg.retry_backoff_ms * 2 ** min(attempts - 1, 16), MAX_BACKOFF_MS)
        log.warning("delivery of %d messages to %s failed (%s); retrying in %d ms",
                    len(items), target, exc, backoff_ms)
        self.wheel.retry(items, now_ms() + backoff_ms)

    async def drain(self, timeout_s: float) -> None:
        """Wait for the frames in flight (their outcome is journaled) up to `timeout_s`."""
        if self._sends:
            await asyncio.wait(set(self._sends), timeout=timeout_s)


def _build(rec: StoredMessage) -> tuple[Target, WireMessage]:
    """Where a local record goes and the SEND entry that takes it there."""
    props = rec.properties
    origin = parse_origin(props.get(ORIGIN_OFFSET, ""))
    try:
        qid = int(props.get(REAL_QUEUE_ID, "-1"))
    except ValueError:
        qid = -1
    msg = WireMessage(rec.body, rec.msg_id, rec.born_ts_ms, rec.flags & _NOT_DELAY, rec.tags,
                      rec.keys, rec.properties_raw)
    return (origin[0] if origin else "", props.get(REAL_TOPIC, ""), qid), msg

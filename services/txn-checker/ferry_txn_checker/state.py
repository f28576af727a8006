"""The checker's bookkeeping: open halves per broker, the op records seen, what is due.

Pure and synchronous (no I/O, no asyncio): the scan loops feed it the records
they pull, the check loop asks it what is due and reports each outcome, and
the checkpoint is a snapshot of it. Memory stays bounded: only OPEN halves
are held (an op record resolves one and drops it), at most `max_open` of
them; ops that arrive before their half ("early": the two queues are pulled
independently) are held until the half scan passes their HALF_OFFSET; the
discarded list and the recently-resolved list keep their newest entries.
"""
from __future__ import annotations

import heapq
import itertools
from collections import Counter, OrderedDict
from collections.abc import Iterable
from typing import Any

from ferry.codec import CHECK_IMMUNITY_MS, REAL_TOPIC, TXN_GROUP, MessageFlag, StoredMessage
from ferry.codec.system_properties import TRACEPARENT, TRACESTATE
from ferry.codec.txn_op import COMMIT, ROLLBACK, TxnOp

from ferry_txn_checker.scans import BrokerScan, OpenTxn, OpMarks, checks_by_age

COMMITTED, ROLLED_BACK, DISCARDED = "committed", "rolled_back", "discarded"
_TRACED = int(MessageFlag.TRACED)
_STATE_OF_ACTION = {COMMIT: COMMITTED, ROLLBACK: ROLLED_BACK}
# A broker whose op scan is behind (down, restarting) must not make every call walk
# all of its due halves: at most this many are put back per call.
MAX_DEFERRED_PER_TAKE = 1000
#: Counters reported by /v1/stats and kept in the checkpoint.
COUNTERS = ("checked", "committed_by_check", "rolled_back_by_check", "discarded",
            "committed_by_producer", "rolled_back_by_producer", "ended_before_check",
            "checks_without_producer", "check_errors", "halves_lost")


def _prop_int(props: dict[str, str], key: str, default: int) -> int:
    try:
        return int(props.get(key, default))
    except ValueError:
        return default


class Book:
    """Every broker's scan state, the due heap, counters and the bounded lists."""

    def __init__(self, *, default_immunity_ms: int, max_open: int, max_discarded: int,
                 max_recent: int, check_interval_ms: int = 60_000, max_checks: int = 15) -> None:
        self.default_immunity_ms = default_immunity_ms
        self.check_interval_ms, self.max_checks = check_interval_ms, max_checks
        self.max_open = max_open
        self.max_discarded = max_discarded
        self.max_recent = max_recent
        self.brokers: dict[str, BrokerScan] = {}
        self.counters: Counter[str] = Counter({name: 0 for name in COUNTERS})
        self.discarded: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.recent: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._heap: list[tuple[int, int, str, str]] = []
        self._seq = itertools.count()
        self.open_count = 0
        self.dirty = False
        self.derive_before_ms = 0  # set by a takeover (forget_positions)

    def broker(self, name: str, *, settled: bool = True) -> BrokerScan:
        """`name`'s scan; a new one starts at 0, or (not `settled`) where scan.py finds."""
        scan = self.brokers.get(name)
        if scan is None:
            scan = self.brokers[name] = BrokerScan(name, settled=settled,
                                                   derive_before_ms=self.derive_before_ms)
        return scan

    # -- the scan -------------------------------------------------------------------

    def add_halves(self, broker: str, records: Iterable[StoredMessage], next_offset: int,
                   hist: str | None = None, prev_hist: str | None = None) -> int:
        """Take pulled %HALF% records; the offset to pull next (short of `next_offset`
        when `max_open` is reached: the rest is pulled again once halves resolve).
        `hist`: the answer's history id; `prev_hist`: that of the record before the first."""
        scan = self.broker(broker)
        self.dirty = True
        for i, rec in enumerate(records):
            if rec.queue_offset < scan.half_next:
                continue  # pulled twice (a restart between pull and checkpoint)
            if self.open_count >= self.max_open:
                scan.half_next = rec.queue_offset
                return rec.queue_offset
            scan.half_next = rec.queue_offset + 1
            self._add_half(scan, rec, hist if i else prev_hist)
        scan.half_next = max(scan.half_next, next_offset)
        if scan.early_ops:
            for msg_id in [i for i, (off, _) in scan.early_ops.items() if off < scan.half_next]:
                del scan.early_ops[msg_id]  # its half is gone (retention) or was seen
        return scan.half_next

    def _add_half(self, scan: BrokerScan, rec: StoredMessage, prev_hist: str | None) -> None:
        msg_id = rec.msg_id_hex
        props = rec.properties
        early = scan.early_ops.pop(msg_id, None)
        if early is not None:
            self._remember(msg_id, scan.name, early[1])
            return
        if msg_id in scan.open:
            return  # a producer re-sent its begin: one transaction
        immunity_ms = max(0, _prop_int(props, CHECK_IMMUNITY_MS, self.default_immunity_ms))
        txn = OpenTxn(msg_id, props.get(TXN_GROUP, ""), scan.name, props.get(REAL_TOPIC, ""),
                      rec.queue_offset, rec.store_ts_ms, immunity_ms, prev_hist=prev_hist)
        if rec.store_ts_ms < scan.derive_before_ms:  # read again by a new leader
            txn.checks = checks_by_age(txn.due_ms, scan.derive_before_ms,
                                       self.check_interval_ms, self.max_checks)
        if rec.flags & _TRACED:
            txn.trace = {k: props[k] for k in (TRACEPARENT, TRACESTATE) if k in props}
        scan.open[msg_id] = txn
        self.open_count += 1
        self._push(txn)

    def add_ops(self, broker: str, records: Iterable[StoredMessage], next_offset: int,
                hist: str | None = None, prev_hist: str | None = None) -> None:
        """Take pulled %OP% records: count each, resolve its half (or hold it as early).
        `hist` and `prev_hist` as for `add_halves`."""
        scan = self.broker(broker)
        self.dirty = True
        for i, rec in enumerate(records):
            if rec.queue_offset < scan.op_next:
                continue
            scan.op_next = rec.queue_offset + 1
            op = TxnOp.from_properties(rec.properties)
            msg_id, by = op.txn_id, op.by
            state = _STATE_OF_ACTION[op.action]
            self._count_op(state, by)
            half_offset = op.half_offset
            scan.op_marks.add(half_offset, rec.queue_offset, hist if i else prev_hist)
            txn = scan.open.pop(msg_id, None)
            if txn is not None:
                self.open_count -= 1
            elif half_offset >= scan.half_next:
                scan.early_ops[msg_id] = (half_offset, state)
            if by == "discarded":
                self._add_discarded(op, scan.name, txn, rec.store_ts_ms)
            self._remember(msg_id, scan.name, state, by)
        scan.op_next = max(scan.op_next, next_offset)

    def _count_op(self, state: str, by: str) -> None:
        by = by if by in ("discarded", "check") else "producer"
        self.counters["discarded" if by == "discarded" else f"{state}_by_{by}"] += 1

    def _add_discarded(self, op: TxnOp, broker: str, txn: OpenTxn | None, at_ms: int) -> None:
        msg_id = op.txn_id
        if msg_id in self.discarded:
            return
        self.discarded[msg_id] = {
            "msg_id": msg_id, "state": DISCARDED, "group": op.group,
            "broker": broker, "topic": op.topic, "half_offset": op.half_offset,
            "store_ms": txn.store_ms if txn else None,
            "checks": txn.checks if txn else None, "discarded_ms": at_ms}
        while len(self.discarded) > self.max_discarded:
            self.discarded.popitem(last=False)

    def _remember(self, msg_id: str, broker: str, state: str, by: str | None = None) -> None:
        self.recent[msg_id] = {"msg_id": msg_id, "state": state, "broker": broker, "by": by}
        self.recent.move_to_end(msg_id)
        while len(self.recent) > self.max_recent:
            self.recent.popitem(last=False)

    # -- the check schedule ---------------------------------------------------------

    def _push(self, txn: OpenTxn, key_ms: int | None = None) -> None:
        key = txn.due_ms if key_ms is None else key_ms
        txn.heap_key = key
        heapq.heappush(self._heap, (key, next(self._seq), txn.broker, txn.msg_id))

    def _live(self, broker: str, msg_id: str, key: int) -> OpenTxn | None:
        scan = self.brokers.get(broker)
        txn = scan.open.get(msg_id) if scan is not None else None
        if txn is None or txn.in_flight or txn.heap_key != key:
            return None  # resolved, being checked, or re-queued since
        return txn

    def take_due(self, now_ms: int, limit: int, defer_ms: int) -> list[OpenTxn]:
        """Up to `limit` open halves due now, marked in flight.

        A half is only handed out once its broker's op scan has seen every op
        stored up to its due time: one committed just before would be checked
        otherwise. Those wait `defer_ms` (and do not block other brokers').
        """
        out: list[OpenTxn] = []
        deferred: list[OpenTxn] = []
        heap = self._heap
        while (heap and heap[0][0] <= now_ms and len(out) < limit
               and len(deferred) < MAX_DEFERRED_PER_TAKE):
            key, _, broker, msg_id = heapq.heappop(heap)
            txn = self._live(broker, msg_id, key)
            if txn is None:
                continue
            if self.brokers[broker].op_synced_ms < txn.due_ms:
                deferred.append(txn)
                continue
            txn.in_flight = True
            out.append(txn)
        for txn in deferred:
            self._push(txn, now_ms + defer_ms)
        return out

    def next_due_ms(self) -> int | None:
        return self._heap[0][0] if self._heap else None

    def checked(self, txn: OpenTxn, now_ms: int, interval_ms: int, forwarded: bool) -> None:
        """A CHECK went out (or found no producer): the next look is `interval_ms` on."""
        self.counters["checked"] += 1
        if not forwarded:
            self.counters["checks_without_producer"] += 1
        txn.checks += 1
        txn.next_check_ms = now_ms + interval_ms
        self._requeue(txn)

    def retry(self, txn: OpenTxn, at_ms: int, *, counted: bool = True) -> None:
        """The broker could not be asked (`counted`), or this node may not ask it now:
        try the same step again at `at_ms`."""
        self.counters["check_errors"] += counted
        txn.in_flight = False
        if txn.msg_id in self.broker(txn.broker).open:
            self._push(txn, at_ms)

    def ended(self, txn: OpenTxn, state: str, *, lost: bool = False) -> None:
        """The broker says `txn` ended (or no longer has it): drop it; the op scan counts."""
        if lost:
            self.counters["halves_lost"] += 1
        elif state != DISCARDED:
            self.counters["ended_before_check"] += 1
        scan = self.broker(txn.broker)
        if scan.open.pop(txn.msg_id, None) is not None:
            self.open_count -= 1
            self.dirty = True
        txn.in_flight = False
        self._remember(txn.msg_id, txn.broker, state)

    def discard(self, txn: OpenTxn, now_ms: int) -> None:
        """The checker rolled `txn` back after max_checks: drop it, list it as discarded.

        The op scan counts it when it reads the op record (once, whoever saw it first).
        """
        scan = self.broker(txn.broker)
        if scan.open.pop(txn.msg_id, None) is not None:
            self.open_count -= 1
        self.dirty = True
        txn.in_flight = False
        self._add_discarded(TxnOp(txn.msg_id, ROLLBACK, "discarded", txn.half_offset, txn.group,
                                  txn.topic), txn.broker, txn, now_ms)
        self._remember(txn.msg_id, txn.broker, ROLLED_BACK, "discarded")

    def _requeue(self, txn: OpenTxn) -> None:
        txn.in_flight = False
        self.dirty = True
        if txn.msg_id in self.broker(txn.broker).open:
            self._push(txn)

    # -- lookups --------------------------------------------------------------------

    def find(self, msg_id: str) -> dict[str, Any] | None:
        msg_id = msg_id.upper()
        for scan in self.brokers.values():
            txn = scan.open.get(msg_id)
            if txn is not None:
                return txn.describe()
        if msg_id in self.discarded:
            return dict(self.discarded[msg_id])
        if msg_id in self.recent:
            return dict(self.recent[msg_id])
        return None

    def list_open(self, limit: int) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for scan in self.brokers.values():
            for txn in scan.open.values():
                if len(out) >= limit:
                    return out
                out.append(txn.describe())
        return out

    def list_discarded(self, limit: int) -> list[dict[str, Any]]:
        items = list(self.discarded.values())
        return [dict(d) for d in reversed(items[-limit:])]  # newest first

    # -- checkpoint -----------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The checkpoint document (see checkpoint.py for the schema)."""
        return {
            "counters": dict(self.counters),
            "brokers": {name: {"half_next": s.half_next, "op_next": s.op_next,
                               "half_hist": s.half_hist, "op_hist": s.op_hist,
                               "open": [t.to_row() for t in s.open.values()],
                               "early_ops": {i: list(v) for i, v in s.early_ops.items()},
                               "op_marks": s.op_marks.rows()}
                        for name, s in self.brokers.items() if s.settled},
            "discarded": list(self.discarded.values()),
        }

    def restore(self, doc: dict[str, Any]) -> None:
        """Load a checkpoint document into this (empty) book."""
        for name, value in doc.get("counters", {}).items():
            self.counters[str(name)] = int(value)
        for name, b in doc.get("brokers", {}).items():
            scan = self.broker(str(name))
            scan.half_next, scan.op_next = int(b["half_next"]), int(b["op_next"])
            scan.half_hist, scan.op_hist = b.get("half_hist"), b.get("op_hist")
            scan.op_marks, scan.settled = OpMarks(b.get("op_marks")), True
            for row in b.get("open", []):
                txn = OpenTxn.from_row(scan.name, row)
                scan.open[txn.msg_id] = txn
                self.open_count += 1
                self._push(txn)
            scan.early_ops = {str(i): (int(v[0]), str(v[1]))
                              for i, v in b.get("early_ops", {}).items()}
        for entry in doc.get("discarded", [])[-self.max_discarded:]:
            self.discarded[str(entry["msg_id"])] = dict(entry)

    def forget_positions(self, at_ms: int) -> None:
        """A new leader that cannot trust its own book: drop every broker's scan (open
        halves, positions); each is read again from the low-water marks committed on its
        broker, halves stored before `at_ms` counting the checks their age allows."""
        self.brokers.clear()
        self._heap.clear()
        self.open_count = 0
        self.dirty = True
        self.derive_before_ms = at_ms

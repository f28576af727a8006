"""Reconciliation (对账): the messages a topic stored in a window against the ledger's rows.

For topic T, group G, scene S (default G) and the window [from_ms, to_ms):

- stored: messages the brokers stored in T with a store time in the window;
- recorded: stored messages with a ledger row of their own (same message id) in S;
- duplicates_prevented: stored messages with no row of their own whose business
  event is recorded all the same: their business key (message key, else id) has
  a row in S under another message id (a producer's resend, a second message for
  the same order), or they are a second stored copy of a recorded message id;
- missing: the other stored messages, stored more than grace_ms before the run;
- pending: the same, but younger than grace_ms (consumers may not have got there);
- orphans: ledger rows of (T, S) recorded in the window, written by G or with no
  group, whose message id is not stored in T: not among the messages stored from
  margin_ms before the window to its end, and not found by id on T's brokers.

Margins (docs/idempotence.md, "Reconciliation"): a message stored at t is
recorded after t, by as much as the consumer lags. Ledger rows are read in
bulk from clock_skew_ms before the window to margin_ms after it; a stored
message that bulk read does not explain is then looked up by message id and
by business key with no time bound, so a lagging consumer never makes a
recorded message look missing. Stored messages are read from margin_ms
before the window, so a row recorded in the window for a message stored a
little earlier is no orphan; rows still unexplained are checked by
QUERY_BY_ID (at most max_orphan_checks per run; beyond, or with a broker
down, they are counted as `orphans_unverified`).
"""
from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from typing import Any

from ferry.errors import MalformedRequestError
from ferry.idempotence import LedgerEntry, validate_scene
from ferry.names import validate_group, validate_topic

from ferry_dedup.config import DedupConfig
from ferry_dedup.ledger_store import LedgerStore
from ferry_dedup.stored import StoredEntry, StoredReader

TRIGGERS = ("api", "schedule")
MAX_GRACE_MS = 24 * 3_600_000
# How far in the future a window may end: a clock a little ahead of the service's.
MAX_FUTURE_MS = 3_600_000


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class ReconcileRequest:
    """One reconciliation to run: what and over which window."""

    topic: str
    group: str
    scene: str
    from_ms: int
    to_ms: int
    grace_ms: int
    trigger: str = "api"

    @classmethod
    def from_json(cls, body: Any, config: DedupConfig, now: int) -> ReconcileRequest:
        """Validate a POST /v1/reconcile body; MalformedRequestError says what is wrong."""
        if not isinstance(body, dict):
            raise MalformedRequestError("the body must be a JSON object")
        unknown = set(body) - {"topic", "group", "scene", "from_ms", "to_ms", "grace_ms"}
        if unknown:
            raise MalformedRequestError(f"unknown field(s): {', '.join(sorted(unknown))}")
        try:
            topic = validate_topic(body.get("topic"))
            group = validate_group(body.get("group"))
            scene = validate_scene(body.get("scene") or group)
        except Exception as exc:
            raise MalformedRequestError(str(exc)) from None
        from_ms, to_ms = _int(body, "from_ms"), _int(body, "to_ms")
        grace_ms = _int(body, "grace_ms", config.grace_ms)
        if not 0 <= from_ms < to_ms:
            raise MalformedRequestError(f"need 0 <= from_ms < to_ms, got {from_ms}..{to_ms}")
        if to_ms - from_ms > config.max_window_ms:
            raise MalformedRequestError(f"the window is at most {config.max_window_ms} ms "
                                        f"(max_window_ms), got {to_ms - from_ms}")
        if to_ms > now + MAX_FUTURE_MS:
            raise MalformedRequestError("to_ms lies more than an hour in the future")
        if not 0 <= grace_ms <= MAX_GRACE_MS:
            raise MalformedRequestError(f"grace_ms must be 0..{MAX_GRACE_MS}, got {grace_ms}")
        return cls(topic, group, scene, from_ms, to_ms, grace_ms)


def _int(body: dict[str, Any], name: str, default: int | None = None) -> int:
    value = body.get(name, default)
    if type(value) is not int:
        raise MalformedRequestError(f"{name} must be an integer (ms since the epoch "
                                    f"or a duration in ms), got {value!r}")
    return value


def new_report_id(started_ms: int) -> str:
    """Ids sort by start time (newest last), so a listing by name is a listing by age."""
    return f"{started_ms:013d}-{secrets.token_hex(3)}"


class Reconciler:
    """Runs reconciliations and builds their report documents."""

    def __init__(self, config: DedupConfig, reader: StoredReader, ledger: LedgerStore) -> None:
        self.config = config
        self.reader = reader
        self.ledger = ledger

    async def run(self, req: ReconcileRequest) -> dict[str, Any]:
        """The report of `req` (TopicNotFoundError / LedgerUnavailableError propagate)."""
        cfg = self.config
        started = now_ms()
        stored = await self.reader.window(req.topic, req.from_ms - cfg.margin_ms, req.to_ms)
        in_window = [m for m in stored.messages if req.from_ms <= m.store_ts_ms < req.to_ms]
        rows = await self.ledger.rows_in_window(req.topic, req.group, req.scene,
                                                req.from_ms - cfg.clock_skew_ms,
                                                req.to_ms + cfg.margin_ms)
        by_msg = {r.msg_id: r for r in rows}
        unexplained = {m.msg_id for m in in_window if m.msg_id not in by_msg}
        for r in await self.ledger.rows_by_msg_ids(req.scene, unexplained):
            if r.topic == req.topic:
                by_msg.setdefault(r.msg_id, r)
        report = _Sections(cfg.sample_limit)
        still = [m for m in in_window if m.msg_id not in by_msg]
        by_key = {r.biz_key: r for r in
                  await self.ledger.rows_by_biz_keys(req.scene, {m.biz_key for m in still})}
        seen: set[str] = set()
        for m in in_window:
            self._judge(m, by_msg, by_key, seen, started - req.grace_ms, report)
        stored_ids = {m.msg_id for m in stored.messages}
        candidates = [r for r in rows if req.from_ms <= r.recorded_ms < req.to_ms
                      and r.msg_id not in stored_ids]
        await self._orphans(req.topic, candidates, report)
        doc: dict[str, Any] = {
            "id": new_report_id(started), "trigger": req.trigger, "topic": req.topic,
            "group": req.group, "scene": req.scene, "from_ms": req.from_ms, "to_ms": req.to_ms,
            "grace_ms": req.grace_ms, "margin_ms": cfg.margin_ms,
            "clock_skew_ms": cfg.clock_skew_ms, "started_ms": started,
            "finished_ms": now_ms(),
            "complete": not stored.errors and not stored.truncated
            and not report.counts["orphans_unverified"],
            "truncated": stored.truncated, "errors": stored.errors + report.errors,
            "counts": {"stored": len(in_window),
                       "ledger_rows": sum(req.from_ms <= r.recorded_ms < req.to_ms
                                          for r in rows),
                       **report.counts},
            "samples": report.samples, "sample_limit": cfg.sample_limit}
        return doc

    @staticmethod
    def _judge(m: StoredEntry, by_msg: dict[str, LedgerEntry],
               by_key: dict[str, LedgerEntry], seen: set[str], grace_before_ms: int,
               report: _Sections) -> None:
        copy = m.msg_id in seen
        seen.add(m.msg_id)
        own = by_msg.get(m.msg_id)
        if own is not None:
            if copy:   # a second stored copy of a recorded message (same id)
                report.add("duplicates_prevented", {**m.to_json(),
                                                   "recorded_msg_id": own.msg_id})
            else:
                report.count("recorded")
            return
        other = by_key.get(m.biz_key)
        if other is not None and other.msg_id != m.msg_id:
            report.add("duplicates_prevented", {**m.to_json(), "recorded_msg_id": other.msg_id})
        elif m.store_ts_ms < grace_before_ms:
            report.add("missing", m.to_json(), sample=not copy)
        else:
            report.add("pending", m.to_json(), sample=not copy)

    async def _orphans(self, topic: str, candidates: list[LedgerEntry],
                       report: _Sections) -> None:
        checks = 0
        for r in candidates:
            if checks >= self.config.max_orphan_checks:
                report.add("orphans_unverified", _row_json(r))
                continue
            checks += 1
            found = await self.reader.is_stored(topic, r.msg_id)
            if found is None:
                report.add("orphans_unverified", _row_json(r))
            elif not found:
                report.add("orphans", _row_json(r))
        if report.counts["orphans_unverified"]:
            report.errors.append(f"{report.counts['orphans_unverified']} ledger row(s) could "
                                 "not be checked against the brokers (listed as "
                                 "orphans_unverified)")


def _row_json(r: LedgerEntry) -> dict[str, Any]:
    return {"msg_id": r.msg_id, "biz_key": r.biz_key, "recorded_ms": r.recorded_ms,
            "group": r.group, "queue_id": r.queue_id, "queue_offset": r.queue_offset}


SECTIONS = ("missing", "pending", "orphans", "orphans_unverified", "duplicates_prevented")


class _Sections:
    """Counts per outcome and capped samples per listed section."""

    def __init__(self, sample_limit: int) -> None:
        self.sample_limit = sample_limit
        self.counts = {"recorded": 0, **{s: 0 for s in SECTIONS}}
        self.samples: dict[str, list[dict[str, Any]]] = {s: [] for s in SECTIONS}
        self.errors: list[str] = []

    def count(self, section: str) -> None:
        self.counts[section] += 1

    def add(self, section: str, item: dict[str, Any], *, sample: bool = True) -> None:
        self.counts[section] += 1
        if sample and len(self.samples[section]) < self.sample_limit:
            self.samples[section].append(item)

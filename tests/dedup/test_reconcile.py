"""Reconciliation on real processes: a planted missing message and a planted orphan, nothing else.

A real mesh stores the messages; a real consumer records each one in the
ledger inside its own transaction (SQLite, and PostgreSQL for a second
service), except one it "loses" (the planted missing message). A resend of an
already-recorded business key fails its ledger insert (DuplicateMessage: a
duplicate prevented), and a row for a message that was never stored is
written straight into the ledger (the planted orphan). The service, asked
over HTTP, must report exactly those.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
import pytest
from ferry import Consumer, Producer
from ferry.idempotence import DuplicateMessage, Ledger

from tests.client.conftest import Mesh, unique
from tests.client.util import FAST
from tests.dedup.conftest import DedupProc, start_dedup, wait_for
from tests.support.procs import Postgres, Redis

pytestmark = pytest.mark.integration

KEYED = 12          # messages with a business key, each recorded once
LOST_KEY = "order-lost"
DUPLICATE_KEY = "order-3"   # sent a second time under a new message id
DEADLINE_S = 60.0


@dataclass(frozen=True)
class Ghost:
    """A ledger row's message that no broker ever stored (the planted orphan)."""

    topic: str
    msg_id: str = field(default_factory=lambda: uuid.uuid4().hex.upper())
    queue_id: int = 0
    queue_offset: int = 999_999
    key: str | None = "order-ghost"


@dataclass
class Planted:
    topic: str
    group: str
    from_ms: int
    lost_id: str
    duplicate_id: str
    first_id: str      # the recorded message the duplicate repeats
    ghost_id: str


Connect = Callable[[], Any]
Transaction = Callable[[Any], contextlib.AbstractContextManager[Any]]


async def plant(mesh: Mesh, connect: Connect, transaction: Transaction) -> Planted:
    """Send, consume and record; lose one message, repeat one key, plant one orphan."""
    topic, group = unique("rec"), unique("billing")
    from_ms = int(time.time() * 1000) - 1000
    ids: dict[str, list[str]] = {}
    async with Producer(namesrv=mesh.namesrv) as producer:
        for key in [f"order-{i}" for i in range(KEYED)] + [LOST_KEY, DUPLICATE_KEY]:
            sent = await producer.send_and_wait(topic, key.encode(), key=key)
            ids.setdefault(key, []).append(sent.msg_id)
    ledger = Ledger(group=group)
    seen = 0
    conn = connect()
    try:
        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while seen < KEYED + 2 and loop.time() < deadline:
                for records in (await consumer.getmany(timeout_ms=500)).values():
                    for rec in records:
                        seen += 1
                        if rec.key == LOST_KEY:
                            continue   # the consumer "lost" it: never recorded
                        with contextlib.suppress(DuplicateMessage), transaction(conn):
                            ledger.record(conn, scene=group, record=rec)
        assert seen == KEYED + 2
        ghost = Ghost(topic)
        with transaction(conn):
            ledger.record(conn, scene=group, record=ghost)
        # Whichever of the two arrived first (they sit in different queues) was recorded.
        with transaction(conn):
            first = ledger.by_biz_key(conn, scene=group, biz_key=DUPLICATE_KEY).msg_id
    finally:
        conn.close()
    (duplicate,) = set(ids[DUPLICATE_KEY]) - {first}
    return Planted(topic, group, from_ms, ids[LOST_KEY][0], duplicate, first, ghost.msg_id)


def reconcile(dedup: DedupProc, p: Planted, grace_ms: int) -> dict[str, Any]:
    return dedup.ok("POST", "/v1/reconcile", {
        "topic": p.topic, "group": p.group, "from_ms": p.from_ms,
        "to_ms": int(time.time() * 1000) + 1000, "grace_ms": grace_ms})


def assert_finds_exactly_the_planted(report: dict[str, Any], p: Planted) -> None:
    assert report["complete"] is True, report["errors"]
    assert report["counts"] == {
        "stored": KEYED + 2, "ledger_rows": KEYED + 1, "recorded": KEYED,
        "missing": 1, "pending": 0, "orphans": 1, "orphans_unverified": 0,
        "duplicates_prevented": 1}, report
    samples = report["samples"]
    assert [m["msg_id"] for m in samples["missing"]] == [p.lost_id]
    assert samples["missing"][0]["biz_key"] == LOST_KEY
    assert [r["msg_id"] for r in samples["orphans"]] == [p.ghost_id]
    assert [(d["msg_id"], d["recorded_msg_id"]) for d in samples["duplicates_prevented"]] == \
        [(p.duplicate_id, p.first_id)]


@pytest.fixture(scope="module")
def sqlite_dedup(mesh: Mesh, redis_server: Redis,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[DedupProc]:
    d = start_dedup(mesh, redis_server.url, tmp_path_factory.mktemp("dedup-sqlite"))
    yield d
    d.proc.stop()


def sqlite_connect(d: DedupProc) -> Connect:
    return lambda: sqlite3.connect(d.data_dir / "ledger.db", timeout=30)


async def test_sqlite_reconciliation_finds_the_planted_missing_and_orphan_only(
        mesh: Mesh, sqlite_dedup: DedupProc) -> None:
    d = sqlite_dedup
    p = await plant(mesh, sqlite_connect(d), lambda conn: conn)   # `with conn:` = a transaction
    report = await asyncio.to_thread(reconcile, d, p, 0)
    assert_finds_exactly_the_planted(report, p)
    assert report["trigger"] == "api" and report["scene"] == p.group

    # Within its grace period the unrecorded message is pending, not missing.
    young = await asyncio.to_thread(reconcile, d, p, 3_600_000)
    assert young["counts"]["missing"] == 0 and young["counts"]["pending"] == 1
    assert [m["msg_id"] for m in young["samples"]["pending"]] == [p.lost_id]

    # Both reports are kept, newest first; the stats count them.
    listing = d.ok("GET", "/v1/reports?limit=5")
    assert [r["id"] for r in listing["reports"][:2]] == [young["id"], report["id"]]
    assert "samples" not in listing["reports"][0]
    assert d.ok("GET", f"/v1/reports/{report['id']}") == report
    stats = d.ok("GET", "/v1/stats")
    assert stats["reconciliations"]["run"] >= 2
    assert stats["last_report"]["id"] == young["id"]
    assert stats["last_report"]["counts"] == young["counts"]


def test_an_unknown_topic_is_a_404(sqlite_dedup: DedupProc) -> None:
    status, body = sqlite_dedup.call("POST", "/v1/reconcile", {
        "topic": unique("never"), "group": "g", "from_ms": 0, "to_ms": 1000})
    assert status == 404 and body["error"]["type"] == "TopicNotFoundError"


async def test_postgresql_reconciliation_finds_the_planted_missing_and_orphan_only(
        mesh: Mesh, redis_server: Redis, postgres: Postgres, pg_database: str,
        tmp_path: Path) -> None:
    url = f"postgresql://postgres@{postgres.host}:{postgres.port}/{pg_database}"
    d = start_dedup(mesh, redis_server.url, tmp_path / "dedup-pg", ledger_url=url)
    try:
        p = await plant(mesh, lambda: psycopg.connect(url), lambda conn: conn.transaction())
        report = await asyncio.to_thread(reconcile, d, p, 0)
        assert_finds_exactly_the_planted(report, p)
        assert d.ok("GET", "/v1/stats")["ledger"] == "postgresql"
        row = d.ok("GET", f"/v1/ledger?scene={p.group}&biz_key={DUPLICATE_KEY}")
        assert row["msg_id"] == p.first_id
    finally:
        d.proc.stop()


async def test_scheduled_reconciliation_keeps_reports(
        mesh: Mesh, redis_server: Redis, tmp_path: Path) -> None:
    topic, group = unique("sched"), unique("g")
    async with Producer(namesrv=mesh.namesrv) as producer:
        await producer.send_and_wait(topic, b"never recorded", key="k-1")
    d = start_dedup(mesh, redis_server.url, tmp_path / "dedup-sched", env={
        "FERRY_DEDUP_RECONCILE": f"{topic}:{group}", "FERRY_DEDUP_RECONCILE_INTERVAL_S": "1",
        "FERRY_DEDUP_GRACE_MS": "0", "FERRY_DEDUP_RECONCILE_WINDOW_MS": "600000"})
    try:
        listing = await asyncio.to_thread(
            wait_for, lambda: d.ok("GET", "/v1/reports")["reports"], 30, "a scheduled report")
        first = listing[0]
        assert first["trigger"] == "schedule" and first["topic"] == topic
        assert first["scene"] == group and first["counts"]["missing"] == 1
        assert d.ok("GET", "/v1/stats")["reconciliations"]["schedule"] >= 1
    finally:
        d.proc.stop()
    # Reports survive a restart of the service.
    again = start_dedup(mesh, redis_server.url, tmp_path / "dedup-sched")
    try:
        assert again.ok("GET", f"/v1/reports/{first['id']}")["counts"]["missing"] == 1
    finally:
        again.proc.stop()


def ferry_cli(dedup: DedupProc, *args: str) -> subprocess.CompletedProcess[str]:
    """`ferry dedup ...` as an operator types it (the service's address in FERRY_DEDUP)."""
    env = {**os.environ, "FERRY_DEDUP": dedup.addr}
    return subprocess.run([sys.executable, "-m", "ferry.cli.main", "dedup", *args], env=env,
                          capture_output=True, text=True, timeout=120)


async def test_the_cli_reconciles_lists_reports_and_looks_up(
        mesh: Mesh, sqlite_dedup: DedupProc) -> None:
    d = sqlite_dedup
    p = await plant(mesh, sqlite_connect(d), lambda conn: conn)
    done = await asyncio.to_thread(ferry_cli, d, "reconcile", "--topic", p.topic, "--group",
                                   p.group, "--since", "10m", "--grace-ms", "0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert_finds_exactly_the_planted(report, p)

    listed = json.loads((await asyncio.to_thread(ferry_cli, d, "reports", "--limit", "1")).stdout)
    assert [r["id"] for r in listed["reports"]] == [report["id"]]
    one = await asyncio.to_thread(ferry_cli, d, "reports", "--id", report["id"])
    assert json.loads(one.stdout)["samples"] == report["samples"]

    by_key = await asyncio.to_thread(ferry_cli, d, "lookup", "--scene", p.group, "--biz-key",
                                     DUPLICATE_KEY)
    assert by_key.returncode == 0 and json.loads(by_key.stdout)["msg_id"] == p.first_id
    by_id = await asyncio.to_thread(ferry_cli, d, "lookup", "--msg-id", p.first_id)
    assert [r["biz_key"] for r in json.loads(by_id.stdout)["rows"]] == [DUPLICATE_KEY]
    # Nothing found, and bad usage, are errors with a message, not tracebacks.
    missing = await asyncio.to_thread(ferry_cli, d, "lookup", "--msg-id", p.lost_id)
    assert missing.returncode == 1 and "MessageNotFoundError" in missing.stderr
    bad = await asyncio.to_thread(ferry_cli, d, "reconcile", "--topic", p.topic, "--group",
                                  p.group, "--since", "soon")
    assert bad.returncode == 2 and "duration" in bad.stderr


async def test_consumer_run_with_the_ledger_then_reconciliation_finds_nothing_wrong(
        mesh: Mesh, sqlite_dedup: DedupProc) -> None:
    """The whole story: `consumer.run(..., idempotence=Ledger().transactional(...))` writes
    the service's ledger (scene and group default to the consumer group); a resend of
    every tenth order is skipped as a duplicate; reconciliation agrees with all of it."""
    d = sqlite_dedup
    topic, group, orders = unique("e2e"), unique("billing"), 60
    async with Producer(namesrv=mesh.namesrv) as producer:
        for i in range(orders):
            await producer.send_and_wait(topic, b"pay", key=f"order-{i}")
        for i in range(0, orders, 10):   # resent by a producer that timed out
            await producer.send_and_wait(topic, b"pay", key=f"order-{i}")
    ran: list[str] = []

    async def bill(rec: Any, conn: Any) -> None:
        ran.append(rec.key)

    check = Ledger().transactional(
        connect=lambda: aiosqlite.connect(d.data_dir / "ledger.db", timeout=30))
    async with check, Consumer(topic, group=group, namesrv=mesh.namesrv,
                               auto_offset_reset="earliest", **FAST) as consumer:
        running = asyncio.create_task(consumer.run(bill, concurrency=4, idempotence=check))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DEADLINE_S
        while (consumer.idempotence_stats is None
               or consumer.idempotence_stats.ran + consumer.idempotence_stats.duplicates
               < orders + orders // 10):
            assert loop.time() < deadline, consumer.idempotence_stats
            await asyncio.sleep(0.05)
        await consumer.stop()
        await running
    assert sorted(ran) == sorted(f"order-{i}" for i in range(orders))

    report = await asyncio.to_thread(ferry_cli, d, "reconcile", "--topic", topic, "--group",
                                     group, "--since", "10m", "--grace-ms", "0")
    counts = json.loads(report.stdout)["counts"]
    assert counts == {"stored": orders + orders // 10, "ledger_rows": orders,
                      "recorded": orders, "duplicates_prevented": orders // 10, "missing": 0,
                      "pending": 0, "orphans": 0, "orphans_unverified": 0}, counts

"""ferry-dedup's HTTP API as a non-Python consumer uses it: claims, look-ups, bad input, Redis down.

The service runs as a process over a real mesh, a real Redis (its own, so the
test can kill it) and its default SQLite ledger, written here the way a
consumer's own transaction writes it (`ferry.idempotence.Ledger`).
"""
from __future__ import annotations

import shutil
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ferry.idempotence import Ledger

from tests.client.conftest import Mesh
from tests.dedup.conftest import DedupProc, start_dedup, wait_for
from tests.support.procs import Proc, free_port, spawn, wait_for_port

pytestmark = pytest.mark.integration


def start_redis_on(workdir: Path, port: int) -> Proc:
    """A redis-server on `port` (so a restart comes back where the service looks)."""
    binary = shutil.which("redis-server")
    assert binary is not None, "redis-server is not installed: run `make setup`"
    proc = spawn("redis", [binary, "--port", str(port), "--bind", "127.0.0.1", "--dir",
                           str(workdir), "--save", "", "--appendonly", "no"], workdir)
    wait_for_port("127.0.0.1", port)
    return proc


@dataclass
class Service:
    dedup: DedupProc
    redis: Proc
    redis_port: int
    workdir: Path


@pytest.fixture(scope="module")
def service(mesh: Mesh, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    workdir = tmp_path_factory.mktemp("dedup-api")
    port = free_port()
    redis = start_redis_on(workdir / "redis", port)
    dedup = start_dedup(mesh, f"redis://127.0.0.1:{port}/0", workdir / "dedup")
    running = Service(dedup, redis, port, workdir)
    yield running
    dedup.proc.stop()
    running.redis.stop()   # the one started last (a test restarts it)


def key() -> str:
    return f"order-{uuid.uuid4().hex[:8]}"


def test_claim_confirm_then_a_duplicate_finds_done(service: Service) -> None:
    d, biz = service.dedup, key()
    first = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": biz})
    assert first["state"] == "claimed" and first["token"]
    # While the first holder processes it, a second delivery must retry later.
    assert d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": biz})["state"] == \
        "processing"
    # Only the holder's token confirms.
    assert d.ok("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": biz,
                                               "token": "0" * 32}) == {"ok": False}
    assert d.ok("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": biz,
                                               "token": first["token"]}) == {"ok": True}
    again = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": biz})
    assert again["state"] == "done" and "token" not in again
    # Another scene acts on the same business key once of its own.
    assert d.ok("POST", "/v1/claims", {"scene": "shipping", "biz_key": biz})["state"] == \
        "claimed"


def test_a_released_claim_can_be_taken_again(service: Service) -> None:
    d, biz = service.dedup, key()
    first = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": biz, "lease_ms": 5000})
    assert first["lease_ms"] == 5000
    assert d.ok("POST", "/v1/claims/release", {"scene": "billing", "biz_key": biz,
                                               "token": first["token"]}) == {"ok": True}
    retry = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": biz})
    assert retry["state"] == "claimed" and retry["token"] != first["token"]
    stats = d.ok("GET", "/v1/stats")["claims"]
    assert stats["outcomes"]["claimed"] >= 2 and stats["releases"]["ok"] >= 1


def test_ledger_lookups_by_business_key_and_message_id(service: Service) -> None:
    d = service.dedup
    msg_id = uuid.uuid4().hex.upper()

    @dataclass(frozen=True)
    class Ref:
        msg_id: str
        topic: str = "orders"
        queue_id: int = 2
        queue_offset: int = 41
        key: str | None = "order-77"

    conn = sqlite3.connect(d.data_dir / "ledger.db", timeout=30)
    try:
        with conn:   # the consumer's own transaction
            Ledger(group="billing").record(conn, scene="billing", record=Ref(msg_id),
                                           amount=1250)
    finally:
        conn.close()
    row = d.ok("GET", "/v1/ledger?scene=billing&biz_key=order-77")
    assert row["msg_id"] == msg_id and row["amount"] == 1250 and row["queue_offset"] == 41
    by_id = d.ok("GET", f"/v1/ledger/messages/{msg_id.lower()}")
    assert [r["biz_key"] for r in by_id["rows"]] == ["order-77"]
    status, body = d.call("GET", "/v1/ledger?scene=billing&biz_key=order-none")
    assert status == 404 and body["error"]["type"] == "MessageNotFoundError"
    status, _ = d.call("GET", f"/v1/ledger/messages/{uuid.uuid4().hex}")
    assert status == 404
    lookups = d.ok("GET", "/v1/stats")["lookups"]
    assert lookups["by_biz_key"] >= 2 and lookups["found"] >= 2 and lookups["not_found"] >= 2


@pytest.mark.parametrize(("method", "path", "body", "raw"), [
    ("POST", "/v1/claims", None, b"{not json"),
    ("POST", "/v1/claims", None, b"[" * 50_000),   # nested past the JSON decoder's recursion
    ("POST", "/v1/claims", ["a list"], None),
    ("POST", "/v1/claims", {"scene": "billing"}, None),
    ("POST", "/v1/claims", {"scene": "bad scene!", "biz_key": "k"}, None),
    ("POST", "/v1/claims", {"scene": "billing", "biz_key": "k", "lease_ms": 5}, None),
    ("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": "k"}, None),
    ("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": "k", "token": "not-mine"},
     None),
    ("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": "k",
                                    "token": "0" * 32 + ",junk"}, None),
    ("GET", "/v1/ledger?scene=billing", None, None),
    ("GET", "/v1/ledger/messages/not-an-id", None, None),
    ("POST", "/v1/reconcile", {"topic": "t", "group": "g", "from_ms": 5, "to_ms": 5}, None),
    ("POST", "/v1/reconcile", {"topic": "%RETRY%g", "group": "g", "from_ms": 0, "to_ms": 1},
     None),
    ("POST", "/v1/reconcile", {"topic": "t", "group": "g", "from_ms": 0, "to_ms": 1,
                               "grace": 1}, None),
    ("POST", "/v1/reconcile", {"topic": "t", "group": "g", "from_ms": "yesterday",
                               "to_ms": 1}, None),
    ("GET", "/v1/reports?limit=0", None, None),
])
def test_bad_input_is_a_400_and_the_service_keeps_serving(
        service: Service, method: str, path: str, body: object, raw: bytes | None) -> None:
    status, answer = service.dedup.call(method, path, body, raw)
    assert status == 400, answer
    assert answer["error"]["type"] == "MalformedRequestError" and answer["error"]["message"]
    assert service.dedup.ok("GET", "/healthz") == {"status": "ok"}


def test_unknown_report_and_endpoint_are_404s(service: Service) -> None:
    status, body = service.dedup.call("GET", "/v1/reports/0000000000000-abcdef")
    assert status == 404 and body["error"]["code"] == 12
    status, _ = service.dedup.call("GET", "/v1/nothing-here")
    assert status == 404


def test_openapi_lists_every_route(service: Service) -> None:
    doc = service.dedup.ok("GET", "/openapi.json")
    assert {"/v1/claims", "/v1/claims/confirm", "/v1/claims/release", "/v1/ledger",
            "/v1/ledger/messages/{msg_id}", "/v1/reconcile", "/v1/reports",
            "/v1/reports/{report_id}", "/v1/stats", "/v1/health"} <= set(doc["paths"])


def test_redis_down_is_a_503_then_claims_recover(service: Service) -> None:
    """Never a silent skip: with Redis away a claim fails (retry later), and works once
    Redis is back, with no restart of the service."""
    d = service.dedup
    assert d.ok("GET", "/v1/health")["status"] == "ok"
    service.redis.kill9()
    try:
        status, body = d.call("POST", "/v1/claims", {"scene": "billing", "biz_key": key()})
        assert status == 503, body
        assert body["error"]["type"] == "StoreUnavailableError"
        assert "Redis unreachable" in body["error"]["message"]
        status, health = d.call("GET", "/v1/health")
        assert status == 503 and health["redis"]["ok"] is False and health["ledger"]["ok"]
        # Everything that does not need Redis still answers.
        assert d.ok("GET", "/healthz") == {"status": "ok"}
        assert d.call("GET", "/v1/ledger?scene=billing&biz_key=none")[0] == 404
    finally:
        service.redis = start_redis_on(service.workdir / "redis", service.redis_port)

    def claimed() -> bool:
        status, body = d.call("POST", "/v1/claims", {"scene": "billing", "biz_key": key()})
        return status == 200 and body["state"] == "claimed"

    wait_for(claimed, 20, "a claim after Redis came back")
    assert d.ok("GET", "/v1/health")["status"] == "ok"
    assert d.ok("GET", "/v1/stats")["claims"]["outcomes"]["unavailable"] >= 1


def test_ledger_database_down_is_a_503_and_claims_keep_working(
        mesh: Mesh, service: Service, tmp_path: Path) -> None:
    """A PostgreSQL ledger nobody listens for: the service starts and serves all the same."""
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/ledger"
    d = start_dedup(mesh, f"redis://127.0.0.1:{service.redis_port}/0", tmp_path / "dedup",
                    ledger_url=dead)
    try:
        status, body = d.call("GET", "/v1/ledger?scene=billing&biz_key=order-1")
        assert status == 503 and body["error"]["type"] == "StoreUnavailableError"
        assert "ledger database unreachable" in body["error"]["message"]
        assert d.call("GET", f"/v1/ledger/messages/{uuid.uuid4().hex}")[0] == 503
        status, health = d.call("GET", "/v1/health")
        assert status == 503 and health["ledger"]["ok"] is False and health["redis"]["ok"]
        assert d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": key()})["state"] == \
            "claimed"
        assert d.ok("GET", "/healthz") == {"status": "ok"}
        # SIGTERM stops it cleanly (exit status 0), database away or not.
        d.proc.popen.send_signal(signal.SIGTERM)
        assert d.proc.popen.wait(timeout=15) == 0, d.proc.log()[-2000:]
        assert "dedup stopped" in d.proc.log()
    finally:
        d.proc.stop()


def test_a_bad_token_never_changes_another_clients_confirm(service: Service) -> None:
    """Confirms arriving together share one Redis call: a malformed token is refused
    up front, so it cannot shift the tokens of the others in that call."""
    d = service.dedup
    mine, theirs = key(), key()
    a = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": mine})
    b = d.ok("POST", "/v1/claims", {"scene": "billing", "biz_key": theirs})
    status, _ = d.call("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": mine,
                                                      "token": a["token"] + ",x"})
    assert status == 400
    assert d.ok("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": theirs,
                                               "token": b["token"]}) == {"ok": True}
    assert d.ok("POST", "/v1/claims/confirm", {"scene": "billing", "biz_key": mine,
                                               "token": a["token"]}) == {"ok": True}

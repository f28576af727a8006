"""Broker with FERRY_AUTH=on, a real process on real etcd: every request code is refused
without a valid, fresh, unreplayed signature; permissions per topic and group; deny wins."""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from ferry.auth.http import signed_url_headers
from ferry.auth.signing import now_ms
from ferry.client.core.connection import BrokerConnection
from ferry.errors import AccessDeniedError, AuthenticationError, error_for_code
from ferry.wire import Frame, RequestCode
from ferry_broker.permissions import PERMISSIONS
from prometheus_client.parser import text_string_to_metric_families

from tests.auth.http_support import uncovered_routes
from tests.broker.auth_support import ADMIN_RULES, creds, rules, seed, send_frame, signed
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.wire_client import WireClient, encode_messages, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDENTITIES = {
    "root": ADMIN_RULES,
    "orders-pub": rules(("allow", "topic:orders", "pub")),
    "orders-cons": rules(("allow", "topic:orders", "sub"), ("allow", "group:g1", "consume")),
    "mixed": rules(("allow", "topic:*", "*"), ("deny", "topic:secret*", "sub"),
                   ("allow", "group:*", "consume")),
    "no-rules": (),
}
# Plausible fields for each code: the refusal must come before they matter.
FIELDS: dict[int, dict[str, Any]] = {
    RequestCode.SEND: {"topic": "orders", "queue_id": 0},
    RequestCode.PULL: {"group": "g1", "topic": "orders", "queue_id": 0, "offset": 0,
                       "max_wait_ms": 0},
    RequestCode.COMMIT_OFFSET: {"group": "g1", "topic": "orders", "queue_id": 0, "offset": 0},
    RequestCode.QUERY_OFFSET: {"group": "g1", "topic": "orders", "queue_id": 0},
    RequestCode.GET_MIN_MAX: {"topic": "orders", "queue_id": 0},
    RequestCode.OFFSET_FOR_TIME: {"topic": "orders", "queue_id": 0, "ts_ms": 0},
    RequestCode.QUERY_BY_ID: {"msg_id": "00" * 16},
    RequestCode.QUERY_BY_KEY: {"topic": "orders", "key": "k"},
    RequestCode.HEARTBEAT: {"client_id": "c1", "group": "g1", "topics": ["orders"],
                            "mode": "clustering"},
    RequestCode.UNREGISTER: {"client_id": "c1", "group": "g1"},
    RequestCode.GET_CONSUMERS: {"group": "g1", "topic": "orders"},
    RequestCode.SEND_BACK: {"group": "g1", "topic": "orders", "queue_id": 0, "queue_offset": 0,
                            "msg_id": "00" * 16, "reconsume_times": 1, "delay_ms": 0,
                            "max_reconsume_times": 3},
    RequestCode.DELIVER_DUE: {"topic": "orders", "queue_id": 0},
    RequestCode.END_TRANSACTION: {"group": "g1", "msg_id": "00" * 16, "action": "commit"},
    RequestCode.CHECK_TRANSACTION: {"group": "g1", "msg_id": "00" * 16},
    RequestCode.LOCK: {"group": "g1", "client_id": "c1", "topic": "orders", "queue_ids": [0]},
    RequestCode.UNLOCK: {"group": "g1", "client_id": "c1", "topic": "orders", "queue_ids": [0]},
}
CODES = sorted(PERMISSIONS)


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    b = start_broker(tmp_path_factory.mktemp("auth-broker"), etcd, prefix=prefix,
                     FERRY_AUTH="on")
    yield b
    b.proc.stop()
    print(b.proc.log()[-5000:])


@pytest.fixture
async def raw(auth_broker: Broker) -> AsyncIterator[WireClient]:
    c = await auth_broker.client()
    yield c
    await c.close()


async def connect(broker: Broker, access_key: str) -> BrokerConnection:
    return await BrokerConnection.open(f"127.0.0.1:{broker.port}",
                                       credentials=creds(access_key))


def error_of(frame: Frame) -> Exception:
    assert frame.error, f"expected a refusal, got {frame.fields}"
    return error_for_code(frame.error, frame.message)


async def still_serving(raw: WireClient, broker: Broker) -> None:
    """The same connection, and another client's, serve valid requests after the refusals."""
    resp = await send_frame(raw, signed(RequestCode.GET_MIN_MAX, {"topic": "orders",
                                                                   "queue_id": 0},
                                        credentials=creds("root")))
    assert not resp.error, resp.message
    other = await connect(broker, "orders-cons")
    try:
        await other.request(RequestCode.GET_MIN_MAX, {"topic": "orders", "queue_id": 0})
    finally:
        await other.close()


def test_every_http_route_has_a_rule() -> None:
    from ferry_broker.api import build_app
    from ferry_broker.permissions import HTTP_ROUTES

    app = build_app(SimpleNamespace(auth=None), lambda: True)  # type: ignore[arg-type]
    assert uncovered_routes(app, HTTP_ROUTES) == []


def test_every_code_has_fields_here() -> None:
    from ferry_broker.handlers import HANDLERS
    from ferry_broker.permissions import OPEN_CODES

    assert set(PERMISSIONS) == set(FIELDS) and not set(PERMISSIONS) & OPEN_CODES
    assert set(HANDLERS) == set(PERMISSIONS) | OPEN_CODES


@pytest.mark.parametrize("code", CODES, ids=lambda c: RequestCode(c).name)
async def test_unsigned_wrong_replayed_and_stale_are_refused(raw: WireClient, auth_broker: Broker,
                                                              code: int) -> None:
    fields = FIELDS[code]
    resp = await send_frame(raw, signed(code, fields))
    err = error_of(resp)
    assert isinstance(err, AuthenticationError) and "authentication required" in str(err)

    forged = signed(code, fields, credentials=creds("root"))
    forged.auth = dict(forged.auth, s=creds("mallory").signing_key)   # 32 wrong bytes
    err = error_of(await send_frame(raw, forged))
    assert isinstance(err, AuthenticationError) and "bad signature" in str(err)

    stale = signed(code, fields, credentials=creds("root"), ts_ms=now_ms() - 120_000)
    err = error_of(await send_frame(raw, stale))
    assert isinstance(err, AuthenticationError) and "stale timestamp" in str(err)

    once = signed(code, fields, credentials=creds("root"))
    first = await send_frame(raw, once)   # may fail on its fields; it was authenticated
    assert first.error not in (AuthenticationError.code, AccessDeniedError.code), first.message
    once.request_id += 1
    err = error_of(await send_frame(raw, once))
    assert isinstance(err, AuthenticationError) and "replayed" in str(err)

    await still_serving(raw, auth_broker)


async def test_unknown_identity_and_tampered_body(raw: WireClient, auth_broker: Broker) -> None:
    err = error_of(await send_frame(raw, signed(RequestCode.GET_MIN_MAX, FIELDS[14],
                                                credentials=creds("mallory"))))
    assert isinstance(err, AuthenticationError) and "unknown or disabled" in str(err)
    body = encode_messages([message(b"pay 10")])
    frame = signed(RequestCode.SEND, FIELDS[RequestCode.SEND], body, credentials=creds("root"))
    frame.body = encode_messages([message(b"pay 99")])
    err = error_of(await send_frame(raw, frame))
    assert isinstance(err, AuthenticationError) and "bad signature" in str(err)
    await still_serving(raw, auth_broker)


async def test_publish_on_one_topic_only(auth_broker: Broker) -> None:
    conn = await connect(auth_broker, "orders-pub")
    body = encode_messages([message(b"hello")])
    try:
        resp = await conn.request(RequestCode.SEND, {"topic": "orders", "queue_id": 0}, body)
        assert resp.fields["count"] == 1
        with pytest.raises(AccessDeniedError, match="'pub' on 'topic:payments'"):
            await conn.request(RequestCode.SEND, {"topic": "payments", "queue_id": 0}, body)
        with pytest.raises(AccessDeniedError, match="'sub' on 'topic:orders'"):
            await conn.request(RequestCode.PULL, FIELDS[RequestCode.PULL])
        with pytest.raises(AccessDeniedError, match="'consume' on 'group:g1'"):
            await conn.request(RequestCode.HEARTBEAT, FIELDS[RequestCode.HEARTBEAT])
        for code in (RequestCode.DELIVER_DUE, RequestCode.CHECK_TRANSACTION,
                     RequestCode.QUERY_BY_ID):
            with pytest.raises(AccessDeniedError, match="on 'admin'"):
                await conn.request(code, FIELDS[code])
        # Refusals do not end the connection.
        resp = await conn.request(RequestCode.SEND, {"topic": "orders", "queue_id": 0}, body)
        assert resp.fields["count"] == 1
    finally:
        await conn.close()


async def test_consumer_reads_its_topic_as_its_group(auth_broker: Broker) -> None:
    conn = await connect(auth_broker, "orders-cons")
    try:
        resp = await conn.request(RequestCode.PULL, FIELDS[RequestCode.PULL])
        assert resp.fields["status"] in ("FOUND", "NO_MESSAGE_IN_QUEUE", "NO_MATCHED_MESSAGE")
        # Its own retry topic is consuming as its group; another group's is not.
        await conn.request(RequestCode.PULL, dict(FIELDS[RequestCode.PULL], topic="%RETRY%g1"))
        with pytest.raises(AccessDeniedError, match="group:g2"):
            await conn.request(RequestCode.PULL, dict(FIELDS[RequestCode.PULL], group="g2",
                                                      topic="%RETRY%g2"))
        with pytest.raises(AccessDeniedError, match="'pub' on 'topic:orders'"):
            await conn.request(RequestCode.SEND, {"topic": "orders", "queue_id": 0},
                               encode_messages([message(b"x")]))
    finally:
        await conn.close()


async def test_deny_beats_allow_and_globs_skip_internal_topics(auth_broker: Broker) -> None:
    conn = await connect(auth_broker, "mixed")
    pull = FIELDS[RequestCode.PULL]
    try:
        await conn.request(RequestCode.PULL, dict(pull, topic="anything"))
        with pytest.raises(AccessDeniedError, match="topic:secret-plans"):
            await conn.request(RequestCode.PULL, dict(pull, topic="secret-plans"))
        with pytest.raises(AccessDeniedError, match="topic:%SCHEDULE%"):
            await conn.request(RequestCode.PULL, dict(pull, topic="%SCHEDULE%"))
    finally:
        await conn.close()
    conn = await connect(auth_broker, "no-rules")
    try:
        with pytest.raises(AccessDeniedError):
            await conn.request(RequestCode.GET_MIN_MAX, FIELDS[RequestCode.GET_MIN_MAX])
    finally:
        await conn.close()


async def test_stats_count_refusals(auth_broker: Broker, raw: WireClient) -> None:
    await send_frame(raw, signed(RequestCode.GET_MIN_MAX, FIELDS[RequestCode.GET_MIN_MAX]))
    conn = await connect(auth_broker, "no-rules")
    try:
        with pytest.raises(AccessDeniedError):
            await conn.request(RequestCode.GET_MIN_MAX, FIELDS[RequestCode.GET_MIN_MAX])
    finally:
        await conn.close()
    url = auth_broker.http + "/v1/stats"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    assert refused.value.code == 401
    refused.value.close()
    request = urllib.request.Request(url, headers=signed_url_headers(creds("root"), "GET", url))
    with urllib.request.urlopen(request, timeout=5) as resp:
        auth = json.loads(resp.read())["auth"]
    assert auth["enabled"] and auth["loaded"] and auth["identities"] == len(IDENTITIES)
    assert auth["refused_unauthenticated"] > 0 and auth["refused_denied"] > 0


async def test_a_flood_of_refused_frames_writes_a_bounded_number_of_log_lines(
        raw: WireClient, auth_broker: Broker) -> None:
    """Every refused frame used to write an INFO line: a client could fill the disk."""
    before = auth_broker.proc.log().count('"request refused')
    frames = [signed(RequestCode.GET_MIN_MAX, {"topic": "orders", "queue_id": 0})
              for _ in range(2000)]
    answers = await asyncio.gather(*(send_frame(raw, f) for f in frames))
    assert all(a.error == AuthenticationError.code for a in answers)
    await still_serving(raw, auth_broker)
    after = auth_broker.proc.log().count('"request refused')
    assert 1 <= after and after - before <= 10  # LogLimiter's burst per kind and minute


def _get(url: str, access_key: str | None) -> tuple[int, bytes]:
    headers = signed_url_headers(creds(access_key), "GET", url) if access_key else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                    timeout=5) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        with exc:
            return exc.code, exc.read()


async def test_metrics_need_admin_read_and_count_the_refusals(auth_broker: Broker,
                                                              raw: WireClient) -> None:
    """GET /metrics with auth on: unsigned 401, without admin read 403; admin read gets the
    refusals of both transports (docs/metrics.md)."""
    await send_frame(raw, signed(RequestCode.GET_MIN_MAX, FIELDS[RequestCode.GET_MIN_MAX]))
    url = auth_broker.http + "/metrics"
    assert _get(url, None)[0] == 401
    assert _get(url, "orders-pub")[0] == 403
    status, body = _get(url, "root")
    assert status == 200
    refused = {(s.labels["transport"], s.labels["reason"]): s.value
               for family in text_string_to_metric_families(body.decode())
               if family.name == "ferry_auth_refused" for s in family.samples}
    assert refused[("http", "unauthenticated")] >= 1 and refused[("http", "denied")] >= 1
    assert refused[("wire", "unauthenticated")] >= 1

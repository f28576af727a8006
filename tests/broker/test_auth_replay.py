"""Brokers with FERRY_AUTH=on, real processes on real etcd: a signature binds the broker it
was made for and does not outlive a restart; the replay guard holds a nonce only for a
permitted request and caps each identity on its own, so one that floods is refused alone.

A request is "captured" as an observer of the network would: a relay between a real
signing client and the broker records the bytes (tests/broker/tap.py), and the frames
are sent again as they were.
"""
from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session, signed_url_headers
from ferry.client.core.connection import BrokerConnection
from ferry.errors import AccessDeniedError, AuthenticationError, BusyError, error_for_code
from ferry.wire import Frame, RequestCode

from tests.broker.auth_support import (
    ADMIN_RULES,
    creds,
    rules,
    seed,
    seed_async,
    send_frame,
)
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.tap import Tap
from tests.broker.wire_client import WireClient, encode_messages, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

IDENTITIES = {
    "root": ADMIN_RULES,
    "app": rules(("allow", "topic:orders", "pub,sub"), ("allow", "group:g1", "consume")),
    "app2": rules(("allow", "topic:orders", "pub,sub"), ("allow", "group:g1", "consume")),
    "reader": rules(("allow", "admin", "read")),
    "no-rules": (),
}
MIN_MAX = {"topic": "orders", "queue_id": 0}
# Small bounds, so that a flood reaches them in a test: the guard's total and one identity's.
MAX_NONCES, MAX_PER_KEY = 300, 100


def _broker(tmp: Path, etcd: Etcd, prefix: str, name: str, **env: str) -> Broker:
    return start_broker(tmp, etcd, prefix=prefix, FERRY_AUTH="on", FERRY_BROKER_NAME=name,
                        **env)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[tuple[Broker, Broker]]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    a = _broker(tmp_path_factory.mktemp("broker-a"), etcd, prefix, "broker-a")
    try:
        b = _broker(tmp_path_factory.mktemp("broker-b"), etcd, prefix, "broker-b")
    except BaseException:
        a.proc.stop()
        raise
    yield a, b
    for broker in (a, b):
        broker.proc.stop()
        print(broker.proc.log()[-3000:])


@pytest.fixture
async def raw_b(pair: tuple[Broker, Broker]) -> AsyncIterator[WireClient]:
    c = await pair[1].client()
    yield c
    await c.close()


def error_of(frame: Frame) -> Exception:
    assert frame.error, f"expected a refusal, got {frame.fields}"
    return error_for_code(frame.error, frame.message)


async def capture(broker: Broker, access_key: str) -> list[Frame]:
    """A real client's SEND and COMMIT_OFFSET to `broker`, as captured on the network."""
    tap = await Tap(broker.port).start()
    conn = await BrokerConnection.open(tap.addr, credentials=creds(access_key))
    try:
        await conn.request(RequestCode.SEND, MIN_MAX, encode_messages([message(b"pay 10")]))
        await conn.request(RequestCode.COMMIT_OFFSET, dict(MIN_MAX, group="g1", offset=0))
    finally:
        await conn.close()
        await tap.close()
    frames = tap.requests(RequestCode.SEND) + tap.requests(RequestCode.COMMIT_OFFSET)
    assert len(frames) == 2 and all(f.auth for f in frames)
    return frames


async def replay(client: WireClient, frame: Frame) -> Frame:
    frame.request_id += 1_000_000   # not signed: an attacker picks any
    return await send_frame(client, frame)


async def max_offset(broker: Broker) -> int:
    conn = await BrokerConnection.open(f"127.0.0.1:{broker.port}", credentials=creds("root"))
    try:
        resp = await conn.request(RequestCode.GET_MIN_MAX, MIN_MAX)
        return int(resp.fields["max_offset"])
    finally:
        await conn.close()


async def test_a_request_captured_at_one_broker_is_refused_at_another(
        pair: tuple[Broker, Broker], raw_b: WireClient) -> None:
    a, b = pair
    frames = await capture(a, "app")
    before_b = await max_offset(b)
    for frame in frames:
        err = error_of(await replay(raw_b, frame))
        assert isinstance(err, AuthenticationError) and "bad signature" in str(err), err
    assert await max_offset(b) == before_b
    # ... and at the broker it was made for, once only.
    raw_a = await a.client()
    try:
        err = error_of(await replay(raw_a, frames[0]))
        assert isinstance(err, AuthenticationError) and "replayed" in str(err)
    finally:
        await raw_a.close()


async def test_the_target_is_learned_unsigned_and_names_the_broker(
        pair: tuple[Broker, Broker], raw_b: WireClient) -> None:
    resp = await raw_b.call(RequestCode.IDENTIFY, {})
    assert resp.fields["target"] == "DefaultCluster/broker-b/0"
    assert (resp.fields["name"], resp.fields["id"]) == ("broker-b", 0)


async def test_an_http_request_signed_for_one_broker_is_refused_at_another(
        pair: tuple[Broker, Broker]) -> None:
    a, b = pair
    headers = signed_url_headers(creds("reader"), "GET", a.http + "/v1/stats")
    request = urllib.request.Request(b.http + "/v1/stats", headers=headers)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=5)   # noqa: S310
    assert refused.value.code == 401
    assert "bad signature" in json.loads(refused.value.read())["error"]["message"]
    refused.value.close()
    request = urllib.request.Request(a.http + "/v1/stats", headers=headers)
    with urllib.request.urlopen(request, timeout=5) as resp:   # noqa: S310
        assert resp.status == 200


async def test_a_request_captured_before_a_restart_is_refused_after_it(
        tmp_path: Path, etcd: Etcd) -> None:
    prefix = unique_prefix()
    await seed_async(etcd.endpoint, prefix, IDENTITIES)
    data = tmp_path / "data"
    broker = start_broker(tmp_path / "one", etcd, data_dir=data, prefix=prefix,
                          FERRY_AUTH="on")
    try:
        frames = await capture(broker, "app")
    finally:
        broker.proc.stop()
    broker = start_broker(tmp_path / "two", etcd, data_dir=data, prefix=prefix,
                          FERRY_AUTH="on")
    try:
        before = await max_offset(broker)
        raw = await broker.client()
        try:
            for frame in frames:   # well inside the 60 s window
                err = error_of(await replay(raw, frame))
                assert isinstance(err, AuthenticationError), err
                assert "before this server started" in str(err), err
        finally:
            await raw.close()
        assert await max_offset(broker) == before
    finally:
        broker.proc.stop()


# -- the replay guard's quotas -----------------------------------------------------------

@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    broker = _broker(tmp_path_factory.mktemp("guarded"), etcd, prefix, "broker-g",
                     FERRY_BROKER_AUTH_MAX_NONCES=str(MAX_NONCES),
                     FERRY_BROKER_AUTH_MAX_NONCES_PER_KEY=str(MAX_PER_KEY))
    yield broker
    broker.proc.stop()
    print(broker.proc.log()[-3000:])


async def _flood(broker: Broker, access_key: str, count: int) -> list[BaseException | None]:
    """`count` signed GET_MIN_MAX of `access_key` at once; each one's error (None: served)."""
    conn = await BrokerConnection.open(f"127.0.0.1:{broker.port}", credentials=creds(access_key))
    try:
        results = await asyncio.gather(
            *(conn.request(RequestCode.GET_MIN_MAX, MIN_MAX) for _ in range(count)),
            return_exceptions=True)
    finally:
        await conn.close()
    return [r if isinstance(r, BaseException) else None for r in results]


async def _served(broker: Broker, access_key: str) -> None:
    """`access_key` is served on the wire and (with admin read) over HTTP."""
    assert await _flood(broker, access_key, 3) == [None] * 3
    async with client_session(creds("reader")) as session:
        async with session.get(broker.http + "/v1/stats") as resp:
            assert resp.status == 200, await resp.text()


def _guard_stats(broker: Broker) -> dict[str, Any]:
    url = broker.http + "/v1/stats"
    request = urllib.request.Request(url, headers=signed_url_headers(creds("root"), "GET", url))
    with urllib.request.urlopen(request, timeout=5) as resp:   # noqa: S310
        return json.loads(resp.read())["auth"]["replay_guard"]  # type: ignore[no-any-return]


async def _http_flood(broker: Broker, credentials: Credentials, count: int) -> list[int]:
    async with client_session(credentials) as session:
        async def one() -> int:
            async with session.get(broker.http + "/v1/stats") as resp:
                await resp.read()
                return resp.status
        return list(await asyncio.gather(*(one() for _ in range(count))))


async def test_an_identity_with_no_rules_cannot_fill_the_guard(guarded: Broker) -> None:
    """Its requests are refused for their permission before their nonce is kept: a flood
    of more than the guard holds, on the wire and over HTTP, leaves it as it was."""
    nonces = _guard_stats(guarded)["nonces"]
    wire = await _flood(guarded, "no-rules", MAX_NONCES + 100)
    assert all(isinstance(e, AccessDeniedError) for e in wire), {type(e) for e in wire}
    http = await _http_flood(guarded, creds("no-rules"), MAX_NONCES + 100)
    assert set(http) == {403}
    assert _guard_stats(guarded)["nonces"] <= nonces + 1   # + the stats call's own
    await _served(guarded, "app")


async def test_an_identity_over_its_quota_is_refused_alone(guarded: Broker) -> None:
    wire = await _flood(guarded, "app", MAX_PER_KEY + 150)
    refused = [e for e in wire if e is not None]
    assert refused and all(isinstance(e, BusyError) for e in refused), {type(e) for e in wire}
    assert f"'app' is over its quota of {MAX_PER_KEY}" in str(refused[0])
    assert wire.count(None) <= MAX_PER_KEY
    # Over HTTP too: the reader floods the stats route past its quota ...
    http = await _http_flood(guarded, creds("reader"), MAX_PER_KEY + 150)
    assert 503 in http and http.count(200) <= MAX_PER_KEY, sorted(set(http))
    # ... and every other identity goes on being served, on the wire and over HTTP.
    assert await _flood(guarded, "app2", 3) == [None] * 3
    async with client_session(creds("root")) as session:
        async with session.get(guarded.http + "/v1/stats") as resp:
            assert resp.status == 200, await resp.text()
            stats = (await resp.json())["auth"]["replay_guard"]
    assert stats["refused_quota"] > 0 and stats["refused_full"] == 0

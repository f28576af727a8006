"""LOCK and UNLOCK against a real broker process: exclusive per group, renewal, expiry,
release on UNREGISTER and on heartbeat expiry, bounds, and the stats count."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry.errors import InvalidNameError, MalformedRequestError
from ferry.wire import RequestCode

from tests.broker.conftest import Broker, start_broker
from tests.broker.wire_client import WireClient, message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

LOCK_EXPIRY_MS = 1500
CONSUMER_EXPIRY_MS = 1500


@pytest.fixture(scope="module")
def short_broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    """A broker whose locks and consumers expire within 1.5 s."""
    b = start_broker(tmp_path_factory.mktemp("locks"), etcd,
                     FERRY_BROKER_LOCK_EXPIRY_MS=str(LOCK_EXPIRY_MS),
                     FERRY_BROKER_CONSUMER_EXPIRY_MS=str(CONSUMER_EXPIRY_MS))
    yield b
    b.proc.stop()
    print(b.proc.log()[-5000:])


async def lock(c: WireClient, group: str, client_id: str, topic: str,
               queue_ids: Any) -> dict[str, Any]:
    resp = await c.call(RequestCode.LOCK, {"group": group, "client_id": client_id,
                                           "topic": topic, "queue_ids": queue_ids})
    return resp.fields


async def unlock(c: WireClient, group: str, client_id: str, topic: str,
                 queue_ids: list[int]) -> None:
    await c.call(RequestCode.UNLOCK, {"group": group, "client_id": client_id, "topic": topic,
                                      "queue_ids": queue_ids})


async def test_locks_are_exclusive_within_a_group_and_released_by_unlock(
        broker: Broker, client: WireClient) -> None:
    got = await lock(client, "lg", "a", "orders", [0, 1, 2])
    assert got == {"locked": [0, 1, 2], "expiry_ms": 60_000}  # the default expiry
    assert (await lock(client, "lg", "b", "orders", [1, 2, 3]))["locked"] == [3]
    assert (await lock(client, "other", "b", "orders", [0, 1]))["locked"] == [0, 1]
    assert (await lock(client, "lg", "a", "orders", [0, 1, 2]))["locked"] == [0, 1, 2]  # renew
    await unlock(client, "lg", "b", "orders", [0, 1])  # not b's: left alone
    assert (await lock(client, "lg", "b", "orders", [1]))["locked"] == []
    await unlock(client, "lg", "a", "orders", [1])
    assert (await lock(client, "lg", "b", "orders", [1]))["locked"] == [1]
    assert broker.get_json("/v1/stats")["locks"] >= 6


async def test_unregister_releases_a_clients_locks(client: WireClient) -> None:
    await client.call(RequestCode.HEARTBEAT, {"client_id": "a", "group": "ug",
                                              "topics": ["t"], "mode": "clustering"})
    assert (await lock(client, "ug", "a", "t", [0, 1]))["locked"] == [0, 1]
    assert (await lock(client, "ug", "z", "t", [5]))["locked"] == [5]  # z never heart-beat
    await client.call(RequestCode.UNREGISTER, {"client_id": "a", "group": "ug"})
    await client.call(RequestCode.UNREGISTER, {"client_id": "z", "group": "ug"})
    assert (await lock(client, "ug", "b", "t", [0, 1, 5]))["locked"] == [0, 1, 5]


async def test_bad_lock_requests_are_refused(client: WireClient) -> None:
    for fields in ({"queue_ids": list(range(1025))}, {"queue_ids": [-1]}, {"queue_ids": [1024]},
                   {"queue_ids": ["0"]}, {"queue_ids": None}, {"client_id": ""},
                   {"client_id": None}):
        with pytest.raises(MalformedRequestError):
            await client.call(RequestCode.LOCK, {"group": "bg", "client_id": "a", "topic": "t",
                                                 "queue_ids": [0], **fields})
    with pytest.raises(InvalidNameError):
        await lock(client, "bad group!", "a", "t", [0])
    assert (await lock(client, "bg", "a", "t", list(range(1024))))["locked"] == list(range(1024))


async def test_a_lock_not_renewed_expires(short_broker: Broker) -> None:
    c = await short_broker.client()
    try:
        got = await lock(c, "eg", "a", "t", [0, 1])
        assert got == {"locked": [0, 1], "expiry_ms": LOCK_EXPIRY_MS}
        assert (await lock(c, "eg", "b", "t", [0, 1]))["locked"] == []
        for _ in range(3):  # renewing keeps it past the expiry time
            await asyncio.sleep(LOCK_EXPIRY_MS / 2000)
            assert (await lock(c, "eg", "a", "t", [0]))["locked"] == [0]
            assert (await lock(c, "eg", "b", "t", [0]))["locked"] == []
        await asyncio.sleep(LOCK_EXPIRY_MS / 1000 + 0.2)
        assert (await lock(c, "eg", "b", "t", [0, 1]))["locked"] == [0, 1]
        assert (await lock(c, "eg", "a", "t", [0]))["locked"] == []
    finally:
        await c.close()


async def test_a_lock_renewal_keeps_a_member_alive_until_both_stop(short_broker: Broker) -> None:
    # The client stops serving a queue half an expiry after its last grant; the broker
    # must not hand the queue over before that, so a LOCK counts as a heartbeat.
    c = await short_broker.client()
    try:
        beat = {"client_id": "a", "group": "hg", "topics": ["t"], "mode": "clustering"}
        await c.call(RequestCode.HEARTBEAT, beat)
        assert (await lock(c, "hg", "a", "t", [3]))["locked"] == [3]
        await asyncio.sleep(CONSUMER_EXPIRY_MS / 2000)
        await lock(c, "hg", "a", "t", [3])  # renewed; no heartbeat since the first
        await asyncio.sleep(CONSUMER_EXPIRY_MS / 2000 + 0.3)  # past the heartbeat's expiry
        members = await c.call(RequestCode.GET_CONSUMERS, {"group": "hg"})
        assert members.fields["members"] == ["a"]
        assert (await lock(c, "hg", "b", "t", [3]))["locked"] == []
        await asyncio.sleep(max(CONSUMER_EXPIRY_MS, LOCK_EXPIRY_MS) / 1000 + 0.2)
        members = await c.call(RequestCode.GET_CONSUMERS, {"group": "hg"})
        assert members.fields["members"] == []   # silent on both: gone, its locks with it
        assert (await lock(c, "hg", "b", "t", [3]))["locked"] == [3]
    finally:
        await c.close()


async def test_a_restarted_broker_grants_no_lock_for_half_an_expiry(tmp_path: Path,
                                                                      etcd: Etcd) -> None:
    # Its old locks are gone with its memory, but their holders may take messages
    # for up to half an expiry after their last grant: nobody may lock meanwhile.
    env = {"FERRY_BROKER_LOCK_EXPIRY_MS": "10000"}
    b = start_broker(tmp_path, etcd, **env)
    try:
        c = await b.client()
        await c.send("rl", 0, [message(b"x")])
        assert (await lock(c, "rg", "a", "rl", [0]))["locked"] == [0]  # a fresh store: at once
        await c.close()
    finally:
        b.proc.stop()
    b = start_broker(tmp_path, etcd, data_dir=b.data_dir, prefix=b.env["FERRY_BROKER_ETCD_PREFIX"],
                     **env)
    try:
        c = await b.client()
        started = time.monotonic()
        assert (await lock(c, "rg", "b", "rl", [0]))["locked"] == []
        while not (await lock(c, "rg", "b", "rl", [0]))["locked"]:
            assert time.monotonic() - started < 15, "never granted after the grace"
            await asyncio.sleep(0.2)
        await c.close()
    finally:
        b.proc.stop()


def test_lock_expiry_is_configured_from_the_environment() -> None:
    from ferry_broker.config import BrokerConfig

    assert BrokerConfig().lock_expiry_ms == 60_000
    cfg = BrokerConfig.from_env({"FERRY_BROKER_LOCK_EXPIRY_MS": "1234"})
    assert cfg.lock_expiry_ms == 1234
    with pytest.raises(ValueError):
        BrokerConfig.from_env({"FERRY_BROKER_LOCK_EXPIRY_MS": "0"})

"""Dedup claims need `claim` on their scene, with FERRY_AUTH=on, as real processes.

An identity granted `claim` on one scene must not claim, confirm or release
keys of another scene: confirming a predictable business key there would make
that scene's real consumer skip and acknowledge the message unprocessed. The
consumer granted its scene claims over HTTP end to end, and the tokens the
service hands out cannot be derived from one another.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from ferry import Admin, Consumer, ConsumerRecord, Producer
from ferry.auth.acl import Rule, admin_rules
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.idempotence import RedisClaim

from tests.auth.http_support import ADMIN, auth_env, seed_identities
from tests.client.conftest import Mesh
from tests.client.util import FAST
from tests.dedup.conftest import DedupProc, start_dedup
from tests.support.procs import Etcd, Redis

pytestmark = pytest.mark.integration

TOPIC = "scene-orders"
#: Consumes TOPIC as group `billing` and claims in scene `billing`, nothing else.
BILLING = Credentials("app-billing", "app-billing-secret-0123")
#: Claims in scene `shipping` only.
SHIPPING = Credentials("app-shipping", "app-shipping-secret-012")
#: A Python consumer of group `payments` whose RedisClaim (scene `billing`) talks to Redis
#: itself: it needs no scene grant, only its topic and group.
PAYMENTS = Credentials("app-payments", "app-payments-secret-01")
RULES = {
    ADMIN: admin_rules(),
    BILLING: (Rule("allow", f"topic:{TOPIC}", ("sub",)),
              Rule("allow", "group:billing*", ("consume",)),
              Rule("allow", "scene:billing", ("claim",))),
    SHIPPING: (Rule("allow", "scene:shipping", ("claim",)),),
    PAYMENTS: (Rule("allow", f"topic:{TOPIC}", ("sub",)),
               Rule("allow", "group:payments", ("consume",))),
}


@pytest.fixture(scope="module")
def secured(etcd: Etcd, redis_server: Redis,
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Mesh, DedupProc]]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("dedup-scenes"), credentials=ADMIN)
    asyncio.run(seed_identities(etcd.endpoint, mesh.prefix, RULES))
    env = auth_env(etcd.endpoint, mesh.prefix)
    mesh.namesrv_env = env
    mesh.broker_env = {"FERRY_AUTH": "on"}
    dedup = None
    try:
        mesh.start_namesrv()
        mesh.start_broker("broker-a")
        asyncio.run(_create_topic(mesh.namesrv))
        dedup = start_dedup(mesh, redis_server.url, mesh.workdir / "dedup", env={
            **env, "FERRY_DEDUP_ETCD": etcd.endpoint, "FERRY_DEDUP_ETCD_PREFIX": mesh.prefix})
        yield mesh, dedup
    finally:
        if dedup is not None:
            dedup.proc.stop()
        mesh.stop()


async def _create_topic(namesrv: str) -> None:
    async with Admin(namesrv=namesrv, credentials=ADMIN) as admin:
        await admin.create_topic(TOPIC, queues=1)


async def _post(creds: Credentials, dedup: DedupProc, path: str,
                body: dict[str, Any]) -> tuple[int, Any]:
    async with client_session(creds, timeout=aiohttp.ClientTimeout(total=15)) as session:
        async with session.post(f"http://{dedup.addr}{path}", json=body) as resp:
            return resp.status, await resp.json(content_type=None)


async def _consume(mesh: Mesh, group: str, handler: Any, until: set[str],
                   idempotence: object = None, creds: Credentials = BILLING) -> list[str]:
    """Run a consumer (as `creds`) until `handler` has seen every key of `until` (or 30 s);
    the keys it saw."""
    seen: list[str] = []

    async def counting(record: ConsumerRecord) -> None:
        await handler(record)
        seen.append(record.key or "")

    async with Consumer(TOPIC, group=group, namesrv=mesh.namesrv, credentials=creds,
                        auto_offset_reset="earliest", **FAST) as consumer:
        task = asyncio.ensure_future(consumer.run(counting, idempotence=idempotence))
        try:
            deadline = time.monotonic() + 30
            while not until <= set(seen) and time.monotonic() < deadline and not task.done():
                await asyncio.sleep(0.1)
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    return seen


async def test_a_scene_grant_does_not_reach_another_scene(
        secured: tuple[Mesh, DedupProc], redis_server: Redis) -> None:
    mesh, dedup = secured
    key = "order-7"   # predictable: the order number
    target = {"scene": "billing", "biz_key": key}
    # the attack: claim the billing consumer's next key and mark it done
    claimed = await _post(SHIPPING, dedup, "/v1/claims", target)
    token = claimed[1].get("token") or "0" * 32
    confirmed = await _post(SHIPPING, dedup, "/v1/claims/confirm", {**target, "token": token})
    released = await _post(SHIPPING, dedup, "/v1/claims/release", {**target, "token": token})
    # the real consumer of scene billing (in-process RedisClaim on the same keys) runs it
    async with Producer(namesrv=mesh.namesrv, credentials=ADMIN) as producer:
        await producer.send_and_wait(TOPIC, b"charge order 7", key=key)

    async def handle(record: ConsumerRecord) -> None:
        pass

    async with RedisClaim(redis_server.url, scene="billing") as claim:
        seen = await _consume(mesh, "payments", handle, {key}, idempotence=claim,
                              creds=PAYMENTS)
    assert seen == [key], "the consumer skipped its message: another scene's grant claimed it"
    for status, doc in (claimed, confirmed, released):
        assert status == 403, doc
        assert doc["error"]["type"] == "AccessDeniedError"
        assert "claim on scene:billing" in doc["error"]["message"], doc
    # its own scene works, and a body without a valid scene is a clear 400
    status, doc = await _post(SHIPPING, dedup, "/v1/claims", {"scene": "shipping",
                                                              "biz_key": key})
    assert status == 200 and doc["state"] == "claimed", doc
    status, doc = await _post(SHIPPING, dedup, "/v1/claims/confirm",
                              {"scene": "shipping", "biz_key": key, "token": doc["token"]})
    assert status == 200 and doc["ok"] is True, doc
    for bad in ({"biz_key": key}, {"scene": "bad scene!", "biz_key": key}):
        status, doc = await _post(SHIPPING, dedup, "/v1/claims", bad)
        assert status == 400 and doc["error"]["type"] == "MalformedRequestError", doc
    async with client_session(SHIPPING) as session:   # the rule reads it before the handler
        async with session.post(f"http://{dedup.addr}/v1/claims", data=b"[" * 50_000) as resp:
            assert resp.status == 400, await resp.text()


async def test_the_granted_consumer_claims_over_http_end_to_end(
        secured: tuple[Mesh, DedupProc]) -> None:
    """A consumer as a non-Python one would: claim, work, confirm, each signed as itself;
    a duplicate then finds `done`. Its tokens are random, not one serial apart."""
    mesh, dedup = secured
    keys = ["invoice-1", "invoice-2"]
    async with Producer(namesrv=mesh.namesrv, credentials=ADMIN) as producer:
        for key in keys:
            await producer.send_and_wait(TOPIC, key.encode(), key=key)
    answers: list[tuple[str, int, Any]] = []

    async def handle(record: ConsumerRecord) -> None:
        biz_key = "h-" + (record.key or "")
        status, doc = await _post(BILLING, dedup, "/v1/claims",
                                  {"scene": "billing.http", "biz_key": biz_key})
        answers.append(("other scene", status, doc))
        body = {"scene": "billing", "biz_key": biz_key}
        status, doc = await _post(BILLING, dedup, "/v1/claims", body)
        answers.append(("claim", status, doc))
        status, doc = await _post(BILLING, dedup, "/v1/claims/confirm",
                                  {**body, "token": doc.get("token", "")})
        answers.append(("confirm", status, doc))

    seen = await _consume(mesh, "billing-http", handle, set(keys))
    assert set(keys) <= set(seen), seen
    for what, status, doc in answers:
        if what == "other scene":   # granted `billing`, not `billing.http`
            assert status == 403 and "claim on scene:billing.http" in str(doc), doc
        elif what == "claim":
            assert status == 200 and doc["state"] == "claimed", doc
        else:
            assert status == 200 and doc["ok"] is True, doc
    # a duplicate finds it done
    status, doc = await _post(BILLING, dedup, "/v1/claims", {"scene": "billing",
                                                             "biz_key": "h-invoice-1"})
    assert status == 200 and doc["state"] == "done", doc
    tokens = [doc["token"] for what, _, doc in answers if what == "claim"]
    a, b = (int(t, 16) for t in tokens[:2])
    assert abs(a - b) > 1 << 64, tokens   # not a shared prefix and a serial

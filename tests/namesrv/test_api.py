"""The namesrv HTTP API over real HTTP, against a real namesrv process and etcd."""
from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from ferry.routing import BrokerInfo, EtcdRegistry

from tests.support.procs import Etcd

from .conftest import Namesrv

pytestmark = pytest.mark.integration


async def call(http: aiohttp.ClientSession, method: str, url: str, **kw: Any
               ) -> tuple[int, Any]:
    async with http.request(method, url, **kw) as resp:
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json()


async def test_health_ready_and_openapi(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    assert (await call(http, "GET", namesrv.url + "/healthz"))[0] == 200
    status, ready = await call(http, "GET", namesrv.url + "/readyz")
    assert status == 200 and ready["status"] == "ready"
    # Ready does not wait for etcd's watch (a name server serves its cache while etcd is
    # briefly away); the watch is up within moments of start (make test once saw False).
    deadline = asyncio.get_running_loop().time() + 10
    while not ready["watching"] and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.05)
        status, ready = await call(http, "GET", namesrv.url + "/readyz")
    assert status == 200 and ready["watching"]
    status, doc = await call(http, "GET", namesrv.url + "/openapi.json")
    assert status == 200 and doc["openapi"].startswith("3.")
    for path in ("/v1/routes/{topic}", "/v1/brokers", "/v1/topics", "/v1/topics/{topic}",
                 "/v1/groups", "/v1/groups/{group}", "/healthz", "/readyz"):
        assert path in doc["paths"], path
    assert set(doc["paths"]["/v1/topics/{topic}"]) >= {"get", "put", "delete"}


async def test_topic_crud(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    base = namesrv.url + "/v1/topics"
    status, body = await call(http, "POST", base, json={"name": "orders", "queues": 2})
    assert status == 201 and body == {"name": "orders", "queues": 2, "perm": "rw",
                                      "type": "normal", "brokers": [], "priority_levels": 1}
    status, body = await call(http, "POST", base, json={"name": "orders"})
    assert status == 409 and body["error"]["type"] == "AlreadyExistsError"
    assert (await call(http, "GET", base + "/orders"))[1]["queues"] == 2
    status, body = await call(http, "PUT", base + "/orders", json={"queues": 6, "type": "fifo"})
    assert status == 200 and body["queues"] == 6
    assert (await call(http, "GET", base + "/orders"))[1]["type"] == "fifo"
    assert "orders" in [t["name"] for t in (await call(http, "GET", base))[1]["topics"]]
    assert (await call(http, "DELETE", base + "/orders")) == (200, {"deleted": "orders"})
    status, body = await call(http, "DELETE", base + "/orders")
    assert status == 404 and body["error"]["code"] == 7
    assert (await call(http, "GET", base + "/orders"))[0] == 404


async def test_topic_priority_levels(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    """priority_levels is stored, served in the route, and refused outside 1..4 or above queues."""
    base = namesrv.url + "/v1/topics"
    status, body = await call(http, "POST", base,
                              json={"name": "urgent", "queues": 4, "priority_levels": 2})
    assert status == 201 and body["priority_levels"] == 2
    assert (await call(http, "GET", base + "/urgent"))[1]["priority_levels"] == 2
    status, route = await call(http, "GET", namesrv.url + "/v1/routes/urgent")
    assert status == 200 and route["priority_levels"] == 2
    for bad in ({"queues": 4, "priority_levels": 5}, {"queues": 4, "priority_levels": 0},
                {"queues": 2, "priority_levels": 3}, {"queues": 4, "priority_levels": "2"},
                {"queues": 4, "priority_levels": True}):
        status, body = await call(http, "PUT", base + "/urgent", json=bad)
        assert status == 400 and "priority_levels" in body["error"]["message"], bad
    assert (await call(http, "GET", base + "/urgent"))[1]["priority_levels"] == 2
    status, doc = await call(http, "GET", namesrv.url + "/openapi.json")
    schemas = doc["components"]["schemas"]
    assert schemas["TopicConfig"]["properties"]["priority_levels"]["maximum"] == 4
    assert "priority_levels" in schemas["Route"]["properties"]


async def test_group_crud(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    base = namesrv.url + "/v1/groups"
    status, body = await call(http, "POST", base, json={"name": "g1", "retry_max": 3})
    assert status == 201 and body["retry_max"] == 3 and body["consume_from"] == "latest"
    assert (await call(http, "POST", base, json={"name": "g1"}))[0] == 409
    assert (await call(http, "PUT", base + "/g1", json={"consume_from": "earliest"}))[0] == 200
    assert (await call(http, "GET", base + "/g1"))[1]["consume_from"] == "earliest"
    assert [g["name"] for g in (await call(http, "GET", base))[1]["groups"]] == ["g1"]
    assert (await call(http, "DELETE", base + "/g1"))[0] == 200
    status, body = await call(http, "GET", base + "/g1")
    assert status == 404 and body["error"] == {"code": 13, "type": "GroupNotFoundError",
                                               "message": "group 'g1' does not exist"}


async def test_route_of_registered_broker(etcd: Etcd, module_prefix: str, namesrv: Namesrv,
                                          http: aiohttp.ClientSession) -> None:
    reg = EtcdRegistry(etcd.endpoint, prefix=module_prefix)
    await reg.start()
    info = BrokerInfo("c1", "broker-r", 0, "127.0.0.1:10911", topics={"served": 8})
    try:
        await reg.register_broker(info, ttl_s=10, keepalive_s=2)
        await call(http, "PUT", namesrv.url + "/v1/topics/routed", json={"queues": 3})
        status, route = await call(http, "GET", namesrv.url + "/v1/routes/routed")
        assert status == 200
        assert route["topic"] == "routed" and route["perm"] == "rw"
        mine = [b for b in route["brokers"] if b["name"] == "broker-r"]
        assert mine == [{"name": "broker-r", "cluster": "c1", "master": "127.0.0.1:10911",
                         "slaves": [], "queues": 3, "perm": "rw", "epoch": 0}]
        brokers = (await call(http, "GET", namesrv.url + "/v1/brokers"))[1]["brokers"]
        assert info.to_dict() in brokers
    finally:
        await reg.unregister_broker()
        await reg.stop()


async def test_unknown_topic_404_and_auto_create(namesrv: Namesrv,
                                                 http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "GET", namesrv.url + "/v1/routes/fresh")
    assert status == 404 and body["error"]["type"] == "TopicNotFoundError"
    status, route = await call(http, "GET", namesrv.url + "/v1/routes/fresh?create=1")
    assert status == 200 and route["topic"] == "fresh"
    assert (await call(http, "GET", namesrv.url + "/v1/topics/fresh"))[1]["queues"] == 4
    assert (await call(http, "GET", namesrv.url + "/v1/routes/fresh"))[0] == 200
    # Internal topics are never auto-created by namesrv.
    status, body = await call(http, "GET", namesrv.url + "/v1/routes/%25RETRY%25g9?create=1")
    assert status == 404


async def test_auto_create_off(etcd: Etcd, start_namesrv: Any, module_prefix: str,
                               http: aiohttp.ClientSession) -> None:
    ns = start_namesrv(module_prefix, auto_create_topics="false")
    status, body = await call(http, "GET", ns.url + "/v1/routes/never?create=1")
    assert status == 404 and "auto-create is off" in body["error"]["message"]


@pytest.mark.parametrize("path", [
    "/v1/topics/bad%20name", "/v1/topics/" + "x" * 128, "/v1/routes/%25FOO%25x",
    "/v1/routes/a.b", "/v1/groups/%25RETRY%25g",
])
async def test_invalid_names_are_400(namesrv: Namesrv, http: aiohttp.ClientSession,
                                     path: str) -> None:
    status, body = await call(http, "GET", namesrv.url + path)
    assert status == 400 and body["error"]["type"] == "InvalidNameError", body


@pytest.mark.parametrize(("method", "path", "data"), [
    ("POST", "/v1/topics", b"{not json"),
    ("POST", "/v1/topics", b""),
    ("POST", "/v1/topics", b"\xff\xfe"),
    ("POST", "/v1/topics", b"[1, 2]"),
    ("POST", "/v1/topics", b"[" * 60_000),
    ("POST", "/v1/topics", b'{"name": "t1", "queues": "8"}'),
    ("POST", "/v1/topics", b'{"name": "t1", "queues": 0}'),
    ("POST", "/v1/topics", b'{"name": "t1", "queues": 1025}'),
    ("POST", "/v1/topics", b'{"name": "t1", "perm": "x"}'),
    ("POST", "/v1/topics", b'{"name": "t1", "colour": "red"}'),
    ("POST", "/v1/topics", b'{"queues": 2}'),
    ("PUT", "/v1/topics/t1", b'{"name": "t2"}'),
    ("POST", "/v1/groups", b'{"name": "g", "broadcast_allowed": "yes"}'),
    ("PUT", "/v1/groups/g", b'{"retry_max": null}'),
    # the record of offset resets (issue 25)
    ("POST", "/v1/groups/g/resets", b'{"to": "yesterday", "topic": "t1", "value": 0, '
                                    b'"queues": []}'),
    ("POST", "/v1/groups/g/resets", b'{"to": "time", "topic": "t1", "value": "1", '
                                    b'"queues": []}'),
    ("POST", "/v1/groups/g/resets", b'{"to": "earliest", "topic": "bad name", "value": 0, '
                                    b'"queues": []}'),
    ("POST", "/v1/groups/g/resets", b'{"to": "latest", "topic": "t1", "value": 0, '
                                    b'"queues": [{"broker": "b", "queue_id": 0, "from": 1}]}'),
    ("POST", "/v1/groups/g/resets", b'{"to": "latest", "topic": "t1", "value": 0, '
                                    b'"queues": {"broker": "b"}}'),
    ("POST", "/v1/groups/g/resets", b'[]'),
])
async def test_bad_bodies_are_400_and_service_keeps_serving(
        namesrv: Namesrv, http: aiohttp.ClientSession, method: str, path: str,
        data: bytes) -> None:
    status, body = await call(http, method, namesrv.url + path, data=data,
                              headers={"Content-Type": "application/json"})
    assert status == 400, body
    assert set(body["error"]) == {"code", "type", "message"} and body["error"]["code"] in (4, 5)
    assert (await call(http, "GET", namesrv.url + "/healthz"))[0] == 200
    assert (await call(http, "GET", namesrv.url + "/v1/topics/t1"))[0] == 404


async def test_offset_resets_are_recorded_newest_first(namesrv: Namesrv,
                                                       http: aiohttp.ClientSession) -> None:
    url = namesrv.url + "/v1/groups/g-resets/resets"
    assert await call(http, "GET", url) == (200, {"resets": []})
    for value in (1, 2):
        record = {"to": "offset", "topic": "t1", "value": value, "force": True, "extra": "x",
                  "queues": [{"broker": "b", "queue_id": 0, "from": 5, "to": value}]}
        status, body = await call(http, "POST", url, json=record)
        assert status == 201 and body["who"] is None and body["at_ms"] > 0, body
        assert "extra" not in body and body["group"] == "g-resets"
    status, body = await call(http, "GET", url)
    assert status == 200 and [r["value"] for r in body["resets"]] == [2, 1]
    assert body["resets"][0]["queues"] == [{"broker": "b", "queue_id": 0, "from": 5, "to": 2}]


async def test_http_errors_are_json(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    status, body = await call(http, "GET", namesrv.url + "/v2/nothing")
    assert status == 404 and body["error"]["code"] == 4
    status, body = await call(http, "PATCH", namesrv.url + "/v1/topics")
    assert status == 405 and "not allowed" in body["error"]["message"]
    status, body = await call(http, "POST", namesrv.url + "/v1/topics",
                              data=b"{" + b" " * 70_000 + b"}")
    assert status == 413 and body["error"]["type"] == "MessageTooLargeError"
    assert (await call(http, "GET", namesrv.url + "/readyz"))[0] == 200


async def test_request_log_lines(namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    await call(http, "GET", namesrv.url + "/v1/topics/logme-missing")
    log = namesrv.proc.log()
    assert '"path": "/v1/topics/logme-missing"' in log and '"status": 404' in log
    assert '"level": "WARNING"' in log


async def test_a_flood_of_failed_requests_writes_a_bounded_number_of_log_lines(
        namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    """One WARNING per failed request used to let a client fill the disk (issue 23)."""
    path = "/v1/topics/flood-missing"
    for _ in range(300):
        assert (await call(http, "GET", namesrv.url + path))[0] == 404
    assert 1 <= namesrv.proc.log().count(f'"path": "{path}"') <= 10


async def test_internal_topics_are_not_written_through_the_api(
        namesrv: Namesrv, http: aiohttp.ClientSession) -> None:
    """`%` topics belong to the broker and its services: namesrv refuses to create, change
    or delete them (issue 16); the owners' own writes to etcd still show up in reads."""
    for method, path, body in (("PUT", "/v1/topics/%SYS%x", {"queues": 2}),
                               ("POST", "/v1/topics", {"name": "%RETRY%g", "queues": 1}),
                               ("DELETE", "/v1/topics/%SCHEDULE%", None)):
        status, answer = await call(http, method, namesrv.url + path.replace("%", "%25"),
                                    json=body)
        assert status == 400 and answer["error"]["type"] == "InvalidNameError", answer
        assert "internal" in answer["error"]["message"]
    status, _ = await call(http, "GET", namesrv.url + "/v1/topics/%25SYS%25x")
    assert status == 404

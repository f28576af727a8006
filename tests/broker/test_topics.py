"""Topic config from etcd: queue counts, permissions, broker lists, auto-creation off."""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aetcd
import pytest
from ferry.errors import (
    InvalidNameError,
    MalformedRequestError,
    NoPermissionError,
    TopicNotFoundError,
)
from ferry.routing import EtcdRegistry, TopicConfig
from ferry.wire import RequestCode, encode_messages

from tests.broker.conftest import start_broker, unique_prefix
from tests.broker.wire_client import message
from tests.support.procs import Etcd

pytestmark = pytest.mark.integration


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not await check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.05)


async def test_broker_follows_topic_config(tmp_path: Path, etcd: Etcd) -> None:
    prefix = unique_prefix()
    reg = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await reg.start()
    await reg.put_topic(TopicConfig(name="configured", queues=4))
    b = start_broker(tmp_path, etcd, prefix=prefix, FERRY_BROKER_AUTO_CREATE_TOPICS="false")
    c = await b.client()
    try:
        async def registered_topics() -> dict[str, int]:
            async with aetcd.Client(host=etcd.host, port=etcd.port) as client:
                got = await client.get(f"{prefix}brokers/DefaultCluster/broker-a/0".encode())
                return json.loads(got.value)["topics"] if got else {}

        assert await registered_topics() == {"configured": 4}
        assert (await c.send("configured", 3, [message(b"ok")]))["count"] == 1
        with pytest.raises(MalformedRequestError, match="out of range"):
            await c.send("configured", 4, [message(b"no")])
        with pytest.raises(TopicNotFoundError):
            await c.send("unknown", 0, [message(b"no")])

        # More queues, then read-only, then served by another broker group only.
        await reg.put_topic(TopicConfig(name="configured", queues=6))

        async def six() -> bool:
            return (await registered_topics()).get("configured") == 6
        await eventually(six)
        assert (await c.send("configured", 5, [message(b"ok")]))["count"] == 1
        await reg.put_topic(TopicConfig(name="configured", queues=6, perm="r"))

        async def read_only() -> bool:
            try:
                await c.send("configured", 0, [message(b"x")])
            except NoPermissionError:
                return True
            return False
        await eventually(read_only)
        _, msgs = await c.pull("configured", 3, 0)  # still readable
        assert [m.body for m in msgs] == [b"ok"]
        await reg.put_topic(TopicConfig(name="configured", queues=6, brokers=("broker-b",)))

        async def unregistered() -> bool:
            return "configured" not in await registered_topics()
        await eventually(unregistered)
        with pytest.raises(NoPermissionError, match="does not serve"):
            await c.send("configured", 0, [message(b"x")])
        # Internal topics are written only by Ferry's own requests (here the scheduler's
        # DELIVER_DUE), whatever the config says; a client SEND to one is refused.
        with pytest.raises(InvalidNameError, match="internal"):
            await c.send("%RETRY%grp", 0, [message(b"retry")])
        got = await c.call(RequestCode.DELIVER_DUE, {"topic": "%RETRY%grp", "queue_id": 0},
                           encode_messages([message(b"retry")]))
        assert got.fields["count"] == 1
    finally:
        await c.close()
        b.proc.stop()
        await reg.stop()

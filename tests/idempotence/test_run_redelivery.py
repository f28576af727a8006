"""10,000 messages, each delivered twice, through `consumer.run(handler, idempotence=...)`.

A consumer PROCESS (auto-commit off) handles every message, says so, and is
killed with -9 before it committed anything; a fresh consumer of the same
group is then handed all 10,000 again. With the ledger (SQLite, PostgreSQL)
every business row exists exactly once and the ledger holds the same
business keys and message ids; with the Redis claim the handler ran once per
message (counted in a Redis hash, outside the killed process).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from ferry import Consumer, Message, Producer

from tests.client.conftest import Mesh, start_mesh, unique
from tests.client.util import FAST
from tests.idempotence.backends import pg_conninfo
from tests.idempotence.conftest import unique_prefix
from tests.idempotence.run_checks import (
    KINDS,
    Setup,
    business_rows,
    create_business_table,
    ledger_rows,
    make_check,
)
from tests.support.procs import Etcd, spawn

pytestmark = [pytest.mark.integration, pytest.mark.slow]

MESSAGES = 10_000
SEND_BATCH = 250
DEADLINE_S = 180.0
CHILD = Path(__file__).with_name("idem_child.py")
# Both consumers heartbeat every 300 ms (idem_child.py, FAST): the broker forgets the
# killed child after 3 s of silence (ten missed heartbeats) instead of the client
# tests' 6 s, so the second pass gets every queue that much sooner.
QUICK_EXPIRY_ENV = {"FERRY_BROKER_CONSUMER_EXPIRY_MS": "3000"}


@pytest.fixture(scope="module")
def mesh(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    # The broker forgets the killed consumer after 3 s, so its queues come back soon.
    m = start_mesh(etcd, tmp_path_factory.mktemp("mesh"), broker_names=("broker-a",),
                   broker_env=QUICK_EXPIRY_ENV)
    yield m
    m.stop()


@pytest.fixture(params=KINDS)
def setup(request: pytest.FixtureRequest, tmp_path: Path) -> Setup:
    if request.param == "sqlite":
        s = Setup("sqlite", str(tmp_path / "app.db"))
    elif request.param == "postgres":
        s = Setup("postgres", pg_conninfo(request.getfixturevalue("postgres"),
                                          request.getfixturevalue("pg_database")))
    else:
        s = Setup("redis", request.getfixturevalue("redis_server").url, unique_prefix())
    create_business_table(s)
    return s


async def _send(mesh: Mesh, topic: str) -> dict[str, str]:
    """Send MESSAGES (odd ones keyed `order-<i>`); their business key by message id."""
    biz_keys: dict[str, str] = {}
    async with Producer(namesrv=mesh.namesrv) as producer:
        for start in range(0, MESSAGES, SEND_BATCH):
            batch = [Message(f"m{i}".encode(), key=f"order-{i}" if i % 2 else None)
                     for i in range(start, start + SEND_BATCH)]
            for message, sent in zip(batch, await producer.send_batch(topic, batch), strict=True):
                biz_keys[sent.msg_id] = message.key or sent.msg_id
    return biz_keys


def _first_pass_then_kill9(mesh: Mesh, setup: Setup, topic: str, group: str,
                           workdir: Path) -> dict[str, int]:
    signal = workdir / "handled.json"
    cfg = {"namesrv": mesh.namesrv, "topic": topic, "group": group, "expect": MESSAGES,
           "signal": str(signal), "setup": {"kind": setup.kind, "target": setup.target,
                                            "prefix": setup.prefix}}
    child = spawn("idem-child", [sys.executable, str(CHILD), json.dumps(cfg)], workdir)
    try:
        deadline = time.monotonic() + DEADLINE_S
        while not signal.exists():
            assert child.alive(), child.log()[-3000:]
            assert time.monotonic() < deadline, "the child did not handle every message"
            time.sleep(0.1)
        time.sleep(0.05)   # the signal file is written whole by then (one small write)
    finally:
        child.kill9()   # before any commit: every message will be delivered again
    return json.loads(signal.read_text())  # type: ignore[no-any-return]


async def _second_pass(mesh: Mesh, setup: Setup, topic: str, group: str) -> dict[str, int]:
    check, handle, close = make_check(setup)
    try:
        async with Consumer(topic, group=group, namesrv=mesh.namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            running = asyncio.create_task(consumer.run(handle, concurrency=8,
                                                       idempotence=check))
            loop = asyncio.get_running_loop()
            deadline = loop.time() + DEADLINE_S
            while (consumer.idempotence_stats is None
                   or consumer.idempotence_stats.duplicates < MESSAGES):
                assert loop.time() < deadline, f"second pass: {consumer.idempotence_stats}"
                await asyncio.sleep(0.1)
            await consumer.stop()
            await running
            assert consumer.idempotence_stats is not None
            return consumer.idempotence_stats.as_dict()
    finally:
        await close()


async def test_each_message_delivered_twice_has_its_effect_once(
        mesh: Mesh, setup: Setup, tmp_path: Path) -> None:
    topic, group = unique("idem-twice"), unique("g")
    biz_keys = await _send(mesh, topic)
    first = _first_pass_then_kill9(mesh, setup, topic, group, tmp_path / "child")
    assert first["ran"] == MESSAGES and first["duplicates"] == 0
    second = await _second_pass(mesh, setup, topic, group)
    assert second["ran"] == 0 and second["failed"] == 0   # every redelivery found it done
    assert second["duplicates"] >= MESSAGES

    if setup.kind == "redis":
        runs = redis.Redis.from_url(setup.target, decode_responses=True).hgetall(setup.runs_key)
        assert set(runs) == set(biz_keys)                     # every message ran...
        assert {int(v) for v in runs.values()} == {1}         # ...exactly once
        return
    rows = business_rows(setup)
    assert len(rows) == MESSAGES   # each business row once
    assert {order for order, _ in rows} == set(biz_keys.values())
    ledger = ledger_rows(setup, scene=group)   # the scene defaults to the group's name
    assert len(ledger) == MESSAGES
    assert {(key, msg_id) for key, msg_id, _ in ledger} == {(o, m) for o, m in rows}
    assert {g for _, _, g in ledger} == {group}
    assert {m for _, m in rows} == set(biz_keys)


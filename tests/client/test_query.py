"""Message queries (Admin.query_message / query_by_key / messages_by_time and `ferry message`)
against a real mesh of two brokers."""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from ferry import Admin, Producer
from ferry.cli.main import main as cli_main
from ferry.cli.messages import parse_time_ms
from ferry.errors import MalformedRequestError

from tests.client.conftest import Mesh, unique
from tests.client.test_cli import ferry

pytestmark = pytest.mark.integration


async def _send(mesh: Mesh, topic: str, n: int, key: str) -> list:
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, f"body-{i}".encode(), key=key if i % 2 == 0 else
                                    f"other-{i}", tags="t", properties={"n": str(i)})
                for i in range(n)]
        return list(await asyncio.gather(*futs))


async def test_admin_queries(mesh: Mesh) -> None:
    topic, key = unique("query"), unique("k")
    before_ms = int(time.time() * 1000) - 1
    sent = await _send(mesh, topic, 12, key)
    after_ms = int(time.time() * 1000) + 1
    assert {r.broker for r in sent} == set(mesh.brokers)
    async with Admin(namesrv=mesh.namesrv) as admin:
        for result in sent[:3]:
            found = await admin.query_message(result.msg_id.lower())
            assert [(r.msg_id, r.topic, r.broker, r.queue_id, r.queue_offset) for r in found] \
                == [(result.msg_id, topic, result.broker, result.queue_id, result.queue_offset)]
            assert found[0].body == f"body-{found[0].properties['n']}".encode()
            assert found.errors == []
        assert list(await admin.query_message("0" * 32)) == []

        by_key = await admin.query_by_key(topic, key)
        assert sorted(r.body for r in by_key) == sorted(f"body-{i}".encode()
                                                        for i in range(0, 12, 2))
        stamps = [r.store_ts_ms for r in by_key]
        assert stamps == sorted(stamps, reverse=True)   # newest first
        assert len(await admin.query_by_key(topic, key, max_count=2)) == 2
        assert list(await admin.query_by_key(topic, "no-such-key")) == []

        window = await admin.messages_by_time(topic, before_ms, after_ms)
        assert sorted(r.msg_id for r in window) == sorted(r.msg_id for r in sent)
        assert list(await admin.messages_by_time(topic, 0, before_ms - 60_000)) == []
        capped = await admin.messages_by_time(topic, before_ms, after_ms, max_count=5)
        assert len(capped) == 5 and capped.truncated

        with pytest.raises(MalformedRequestError):
            await admin.query_message("not-an-id")
        with pytest.raises(MalformedRequestError):
            await admin.query_by_key(topic, "two words")
        with pytest.raises(MalformedRequestError):
            await admin.messages_by_time(topic, after_ms, before_ms)


async def test_query_reads_every_stored_copy_and_moves_no_offset(mesh: Mesh) -> None:
    """A time query commits nothing: its read group has no offset afterwards."""
    topic = unique("query")
    sent = await _send(mesh, topic, 4, unique("k"))
    async with Admin(namesrv=mesh.namesrv) as admin:
        found = await admin.messages_by_time(topic, 0, int(time.time() * 1000) + 1)
        assert len(found) == 4
        lag = await admin.group_lag("ferry-admin-query", [topic])
        assert all(q.committed < 0 for q in lag)
    assert {r.msg_id for r in found} == {r.msg_id for r in sent}


def test_parse_time() -> None:
    assert parse_time_ms("1700000000000") == 1_700_000_000_000
    assert parse_time_ms("15m", now_ms=1_000_000) == 100_000
    assert parse_time_ms("2024-01-01T00:00:00") == 1_704_067_200_000
    assert parse_time_ms("2024-01-01T01:00:00+01:00") == 1_704_067_200_000


async def test_cli_message_commands(mesh: Mesh) -> None:
    topic, key = unique("query"), unique("k")
    sent = await _send(mesh, topic, 4, key)
    res = await asyncio.to_thread(ferry, mesh, "message", "get", sent[1].msg_id)
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[-1] == "total: 1"
    doc = json.loads(lines[0])
    assert doc["msg_id"] == sent[1].msg_id and doc["body"] == "body-1"
    assert doc["properties"]["n"] == "1" and doc["topic"] == topic and doc["tags"] == "t"

    res = await asyncio.to_thread(ferry, mesh, "message", "key", topic, key)
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "total: 2", res.stderr
    res = await asyncio.to_thread(ferry, mesh, "message", "time", topic, "--from", "10m")
    assert res.returncode == 0 and res.stdout.splitlines()[-1] == "total: 4", res.stderr

    res = await asyncio.to_thread(ferry, mesh, "message", "get", "F" * 32)
    assert res.returncode == 1 and "MessageNotFoundError" in res.stderr
    res = await asyncio.to_thread(ferry, mesh, "message", "get", "xyz")
    assert res.returncode == 1 and "MalformedRequestError" in res.stderr
    res = await asyncio.to_thread(ferry, None, "message", "time", topic, "--from", "yesterday")
    assert res.returncode == 2


def test_message_help(capsys: pytest.CaptureFixture[str]) -> None:
    # Through the `ferry` entry point in-process (test_cli runs the installed script).
    for args in (["message"], ["message", "get"], ["message", "key"], ["message", "time"]):
        with pytest.raises(SystemExit) as exited:
            cli_main([*args, "--help"])
        out, err = capsys.readouterr()
        assert exited.value.code == 0 and "usage: ferry message" in out, (args, err)

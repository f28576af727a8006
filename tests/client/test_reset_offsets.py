"""`ferry group reset-offsets` against a real mesh (two brokers): by time on a group with
a committed position, --dry-run, the refusal while members are live and --force."""
from __future__ import annotations

import asyncio
import time

import pytest
from ferry import Admin, Consumer, Producer
from ferry.client import ConsumerRecord

from tests.client.conftest import Mesh, unique
from tests.client.test_cli import ferry
from tests.client.util import FAST, collect

pytestmark = pytest.mark.integration


async def _send(mesh: Mesh, topic: str, bodies: list[str]) -> None:
    async with Producer(namesrv=mesh.namesrv) as producer:
        futs = [await producer.send(topic, b.encode()) for b in bodies]
        await asyncio.gather(*futs)


async def _topic(mesh: Mesh, bodies: list[str]) -> tuple[str, str]:
    """A new topic of 2 queues per broker holding `bodies`, and a new group name."""
    topic = unique("reset")
    async with Admin(namesrv=mesh.namesrv) as admin:
        await admin.create_topic(topic, queues=2)
    await _send(mesh, topic, bodies)
    return topic, unique("g")


async def _committed(mesh: Mesh, group: str, topic: str) -> dict[tuple[str, int], int]:
    async with Admin(namesrv=mesh.namesrv) as admin:
        return {(q.tq.broker, q.tq.queue_id): q.committed
                for q in await admin.group_lag(group, [topic])}


async def _drain(mesh: Mesh, topic: str, group: str, n: int) -> list[ConsumerRecord]:
    """Consume `n` records as `group` (from where it committed), commit, and leave."""
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        enable_auto_commit=False, **FAST) as consumer:
        got = (await collect([consumer], n, timeout_s=30, settle_s=1.0))[0]
        await consumer.commit()
    return got


async def _read_all(mesh: Mesh, member: Consumer, group: str, topic: str,
                    bodies: list[str]) -> dict[tuple[str, int], int]:
    """`member` delivers `bodies` and commits: the group's committed offsets then."""
    first = (await collect([member], len(bodies), timeout_s=30, settle_s=1.0))[0]
    assert sorted(r.body.decode() for r in first) == sorted(bodies)
    await member.commit()
    at_end = await _committed(mesh, group, topic)
    assert sum(at_end.values()) == len(bodies)
    return at_end


async def test_reset_by_time_replays_from_there_and_dry_run_changes_nothing(mesh: Mesh) -> None:
    topic, group = await _topic(mesh, [f"a{i}" for i in range(12)])
    await asyncio.sleep(0.05)   # a store time strictly after every earlier message
    t_ms = int(time.time() * 1000)
    await asyncio.sleep(0.05)
    after = [f"b{i}" for i in range(12)]
    await _send(mesh, topic, after)
    assert len(await _drain(mesh, topic, group, 24)) == 24
    at_end = await _committed(mesh, group, topic)
    assert len(at_end) == 4 and sum(at_end.values()) == 24

    res = ferry(mesh, "group", "reset-offsets", group, "--topic", topic,
                "--to-time", str(t_ms), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "dry run: nothing changed" in res.stdout
    assert len([line for line in res.stdout.splitlines() if line.startswith(topic)]) == 4
    assert await _committed(mesh, group, topic) == at_end

    iso = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t_ms // 1000)) + \
        f".{t_ms % 1000:03d}Z"
    res = ferry(mesh, "group", "reset-offsets", group, "--topic", topic, "--to-time", iso)
    assert res.returncode == 0, res.stderr
    assert f"reset {group} on {topic}: 4 queue(s)" in res.stdout
    moved = await _committed(mesh, group, topic)
    assert sum(at_end.values()) - sum(moved.values()) == 12
    async with Admin(namesrv=mesh.namesrv) as admin:   # the reset is on record
        [record] = await admin.offset_resets(group)
    assert record["to"] == "time" and record["value"] == t_ms and record["who"] is None
    assert {(q["broker"], q["queue_id"]): (q["from"], q["to"]) for q in record["queues"]} == \
        {k: (at_end[k], moved[k]) for k in moved}

    again = await _drain(mesh, topic, group, 12)
    assert sorted(r.body.decode() for r in again) == sorted(after)
    # On every queue the first delivery is the first message stored at or after T.
    for (broker, qid), offset in moved.items():
        first = min((r for r in again if (r.broker, r.queue_id) == (broker, qid)),
                    key=lambda r: r.queue_offset, default=None)
        if first is not None:
            assert first.queue_offset == offset and first.store_ts_ms >= t_ms
    assert await _committed(mesh, group, topic) == at_end


async def test_reset_refused_with_live_members_and_forced_members_follow(mesh: Mesh) -> None:
    bodies = [f"m{i}" for i in range(16)]
    topic, group = await _topic(mesh, bodies)
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as member:
        at_end = await _read_all(mesh, member, group, topic, bodies)

        res = ferry(mesh, "group", "reset-offsets", group, "--topic", topic, "--to-earliest")
        assert res.returncode == 1
        assert "BusyError" in res.stderr and "live member" in res.stderr
        assert await _committed(mesh, group, topic) == at_end

        res = ferry(mesh, "group", "reset-offsets", group, "--topic", topic, "--to-earliest",
                    "--force")
        assert res.returncode == 0, res.stderr
        assert "live members: " in res.stdout
        # The live member is told: it delivers everything again, and its own commits
        # do not put the old position back.
        replay = (await collect([member], 16, timeout_s=30, settle_s=1.0))[0]
        assert sorted(r.body.decode() for r in replay) == sorted(bodies)
        await member.commit()
        assert await _committed(mesh, group, topic) == at_end
        await _send(mesh, topic, ["new"])
        later = (await collect([member], 1, timeout_s=30, settle_s=0.5))[0]
        assert [r.body for r in later] == [b"new"]


async def test_a_forced_reset_survives_a_broker_restart(mesh: Mesh) -> None:
    """reset --force, then broker-a is killed (-9) and restarted before the live member
    pulls from it again: the restarted broker still tells the member, which delivers every
    message again (none skipped) and whose commits do not put its old position back."""
    bodies = [f"r{i}" for i in range(16)]
    topic, group = await _topic(mesh, bodies)
    async with Consumer(topic, group=group, namesrv=mesh.namesrv, auto_offset_reset="earliest",
                        **FAST) as member:
        at_end = await _read_all(mesh, member, group, topic, bodies)
        # This event loop is blocked from here to the restart: the member cannot pull
        # meanwhile. Its parked PULLs are answered (empty) first, so no parked PULL hears
        # of the reset either: broker-a's marks are still pending when it dies.
        time.sleep(FAST["pull_max_wait_ms"] / 1000 + 0.5)
        res = ferry(mesh, "group", "reset-offsets", group, "--topic", topic, "--to-earliest",
                    "--force")
        assert res.returncode == 0, res.stderr
        mesh.brokers["broker-a"].proc.kill9()
        mesh.start_broker("broker-a")
        replay = (await collect([member], 16, timeout_s=30, settle_s=1.0))[0]
        assert sorted(r.body.decode() for r in replay) == sorted(bodies)
        assert sorted((r.queue_id, r.queue_offset) for r in replay if r.broker == "broker-a") \
            == [(q, o) for q in (0, 1) for o in range(at_end["broker-a", q])]
        await member.commit()
        assert await _committed(mesh, group, topic) == at_end
        await _send(mesh, topic, ["after"])
        later = (await collect([member], 1, timeout_s=30, settle_s=0.5))[0]
        assert [r.body for r in later] == [b"after"]

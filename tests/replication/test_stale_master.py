"""A master that hangs past its lease (SIGSTOP) and comes back (SIGCONT): no second master.

While the master is stopped, its election lease ends and the slave takes over
with a higher epoch. Requests sent to the stale master after it stopped wait in
its socket buffers; when it runs again it must refuse them (NotMasterError),
never acknowledge them, in sync and in async mode: every ack is recorded with
the time its request was sent, and none may be for a request sent after the
pause. A request the master
had checked and answered just as it stopped may have its ack go out only after
it runs again (SIGSTOP can land between the last lease check and the socket
write): that ack is allowed, since the write had reached the in-sync slave, and
the test checks exactly that: every acknowledged body is in the new master's
log. Then the stale master rejoins as a slave and its log equals the new
master's.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from ferry import Message, Producer
from ferry.client.core.connection import BrokerConnection
from ferry.client.producing.encoding import to_wire
from ferry.errors import FerryError, NotMasterError
from ferry.wire import RequestCode, encode_messages

from tests.replication.test_kill_master import _wait_same_end, _whole_log
from tests.support.ha import Cluster, HaBroker

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "ha-stale"
SEND_INTERVAL_S = 0.02


@dataclass
class DirectSender:
    """Sends to ONE broker address (no route, no retry); records each answer with the
    time its request was sent and its body (each body is unique)."""

    addr: str
    acks: list[tuple[float, bytes]] = field(default_factory=list)    # (sent at, body)
    refusals: list[tuple[float, str]] = field(default_factory=list)  # (time, error type)
    _stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def run(self) -> None:
        conn = await BrokerConnection.open(self.addr, request_timeout_ms=60_000)
        pending: set[asyncio.Task[None]] = set()
        seq = 0
        try:
            while not self._stop.is_set():
                seq += 1
                task = asyncio.create_task(self._one(conn, b"direct-%08d" % seq))
                pending.add(task)
                task.add_done_callback(pending.discard)
                await asyncio.sleep(SEND_INTERVAL_S)
            if pending:
                await asyncio.wait(pending, timeout=15)
        finally:
            await conn.close()

    async def _one(self, conn: BrokerConnection, payload: bytes) -> None:
        body = encode_messages([to_wire(Message(payload))])
        sent = time.monotonic()   # request() writes the frame before its first await
        try:
            await conn.request(RequestCode.SEND, {"topic": TOPIC, "queue_id": 0}, body)
        except FerryError as exc:
            self.refusals.append((time.monotonic(), type(exc).__name__))
        else:
            self.acks.append((sent, payload))

    def stop(self) -> None:
        self._stop.set()


@pytest.mark.parametrize("replication", ["sync", "async"])
async def test_a_stale_master_acknowledges_nothing_after_the_new_election(
        clusters: Callable[..., Cluster], replication: str) -> None:
    # Sync: the in-sync set fences a stale master too (its waits fail); async has only
    # the lease check on every write, so there it alone is what the test sees.
    cluster = clusters(replication=replication)
    old, old_epoch = cluster.wait_master("broker-a")
    async with Producer(namesrv=cluster.namesrv) as producer:
        await producer.send_and_wait(TOPIC, b"first")   # the topic exists on the group
    sender = DirectSender(old.addr)
    task = asyncio.create_task(sender.run())
    await asyncio.sleep(1.0)
    assert sender.acks, f"the master acknowledged nothing before the pause: {sender.refusals}"
    old.pause()
    # Every request sent from here on meets a stopped process (SIGSTOP takes hold within
    # microseconds of kill(); the margin keeps a request that raced it out of the count).
    paused_at = time.monotonic() + 0.05
    try:
        new, new_epoch = await asyncio.to_thread(cluster.wait_master, "broker-a",
                                                 not_addr=old.addr, min_epoch=old_epoch + 1)
        await asyncio.sleep(1.0)   # requests pile up in the stale master's socket
    finally:
        old.resume()
    await asyncio.sleep(3.0)       # it runs again: answers what piled up, then steps down
    sender.stop()
    await task
    stale_acks = [body for sent, body in sender.acks if sent > paused_at]
    assert new_epoch > old_epoch
    assert stale_acks == [], f"{len(stale_acks)} writes acknowledged by the stale master"
    assert any(kind == NotMasterError.__name__ for _, kind in sender.refusals), sender.refusals
    # It rejoins as a slave of the new master, and their logs agree; in sync mode every
    # write the old master acknowledged (before or just as it stopped) is in the new
    # master's log (async may lose the last ones: that is its documented trade).
    log = await _rejoined(cluster, old, new)
    if replication == "sync":
        missing = [body for _, body in sender.acks if body not in log]
        assert missing == [], f"{len(missing)} acknowledged writes are not in the new log"


async def _rejoined(cluster: Cluster, old: HaBroker, new: HaBroker) -> bytes:
    await asyncio.to_thread(cluster.wait_role, old, "slave")
    async with Producer(namesrv=cluster.namesrv, retries=50, retry_backoff_ms=100) as producer:
        for i in range(20):
            await producer.send_and_wait(TOPIC, f"after-{i}".encode())
    end = await _wait_same_end(old, new)
    old.stop()
    new.stop()
    log = _whole_log(new.data_dir, end)
    assert _whole_log(old.data_dir, end) == log
    return log

"""Fuzzing a master's replication port with auth on: hostile HELLO and AUTH openings.

The master of the auth-on group (tests/fuzz/conftest.py) gets REPL_CONNECTIONS
connections, REPL_PARALLEL at a time, each one opening from repl_frames.py
(garbage, hostile HELLOs, every wrong AUTH, a valid signature without the
right, replays) then a half-close. Each must be closed by the master with at
most a REFUSE: never a WELCOME. Meanwhile the real slave stays linked and a
signing client's sends are acknowledged through it (sync replication), so
the link is served all along. At the end both processes live, the master
logged no crash, its RssAnon (sampled all along) peaked less than
RSS_GROWTH_MAX_BYTES over its start, and /v1/stats counted the refused AUTHs.
The count scales with FERRY_FUZZ_FRAMES (one connection per 20 frames: 50,000 in
`make fuzz`).
"""
from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest
from ferry.client.core.connection import BrokerConnection
from ferry.wire import RequestCode, encode_messages
from ferry_broker.replication import protocol as p

from tests.broker.wire_client import message
from tests.fuzz.conftest import FEW, REPLICA, VALID, VALID_TOPIC, AuthGroup
from tests.fuzz.repl_frames import OPENING_KINDS, OpeningFuzzer
from tests.fuzz.support import RssSampler
from tests.fuzz.test_fuzz_wire import FRAMES, SEED

pytestmark = [pytest.mark.slow, pytest.mark.integration]

REPL_CONNECTIONS = max(FRAMES // 20, 2 * len(OPENING_KINDS) * 10)
#: Connections at once: well under the port's MAX_CONNECTIONS, so the slave always has room.
REPL_PARALLEL = 8
RSS_GROWTH_MAX_BYTES = 64 << 20
CLOSE_TIMEOUT_S = 15.0


class Tally:
    def __init__(self) -> None:
        self.connections = 0
        self.refused = 0      # answered REFUSE
        self.silent = 0       # closed without a word
        self.wrong: list[str] = []
        self.valid_sends = 0


async def opening(port: int, fuzzer: OpeningFuzzer, tally: Tally) -> None:
    kind, data = fuzzer.opening()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        writer.write_eof()
        answer = await asyncio.wait_for(reader.read(), CLOSE_TIMEOUT_S)
    except ConnectionResetError:
        answer = b""
    finally:
        writer.close()
    tally.connections += 1
    if not answer:
        tally.silent += 1
        return
    (size,) = p.LENGTH.unpack_from(answer)
    ftype = answer[p.LENGTH.size] if len(answer) > p.LENGTH.size else -1
    if ftype != p.FrameType.REFUSE or len(answer) != p.LENGTH.size + size:
        tally.wrong.append(f"{kind}: answered type {ftype} ({len(answer)} bytes), not one REFUSE")
    else:
        tally.refused += 1


async def worker(port: int, fuzzer: OpeningFuzzer, n: int, tally: Tally) -> None:
    for _ in range(n):
        await opening(port, fuzzer, tally)


async def valid_sends(group: AuthGroup, stop: asyncio.Event, tally: Tally) -> None:
    """Signed sends, each acknowledged once the slave has it (sync): the link is up."""
    conn = await BrokerConnection.open(f"127.0.0.1:{group.master.port}", credentials=VALID)
    try:
        while not stop.is_set():
            ack = await conn.request(RequestCode.SEND, {"topic": VALID_TOPIC, "queue_id": 1},
                                     encode_messages([message(b"replicated")]))
            assert ack.fields["count"] == 1
            tally.valid_sends += 1
            await asyncio.sleep(0.05)
    finally:
        await conn.close()


async def test_hostile_openings_of_the_replication_port(auth_group: AuthGroup) -> None:
    master = auth_group.master
    fuzzers = [OpeningFuzzer(SEED * 77 + i, cluster="DefaultCluster", name="broker-a",
                             master_id=int(master.env["FERRY_BROKER_ID"]), replica=REPLICA,
                             few=FEW) for i in range(REPL_PARALLEL)]
    before = (await asyncio.to_thread(auth_group.stats))["auth"]
    tally, stop = Tally(), asyncio.Event()
    started = time.monotonic()
    pids = {"master": master.proc.popen.pid, "slave": auth_group.slave.proc.popen.pid}
    async with RssSampler(pids) as rss:
        valid = asyncio.create_task(valid_sends(auth_group, stop, tally))
        await asyncio.gather(*(worker(auth_group.master_repl_port, f,
                                      REPL_CONNECTIONS // REPL_PARALLEL, tally)
                               for f in fuzzers))
        stop.set()
        await valid
    elapsed = time.monotonic() - started
    kinds: Counter[str] = Counter()
    for f in fuzzers:
        kinds.update(f.counts)
    stats = await asyncio.to_thread(auth_group.stats)
    print(f"\nreplication fuzz (seed {SEED}): {tally.connections} openings in {elapsed:.1f}s, "
          f"{tally.refused} REFUSEd, {tally.silent} closed without a word, "
          f"{tally.valid_sends} valid sends acknowledged through the slave")
    for name in pids:
        print(f"  {name}: {rss.report(name)}")
    print(f"kinds: {dict(sorted(kinds.items()))}")
    print(f"auth: {stats['auth']}; replication: {stats['replication'].get('slaves')}")
    assert not tally.wrong, "\n".join(tally.wrong[:20])
    assert master.proc.alive() and auth_group.slave.proc.alive()
    log = master.proc.log()
    assert "crashed" not in log and "Traceback" not in log, log[-5000:]
    for name in pids:
        assert rss.growth(name) < RSS_GROWTH_MAX_BYTES, (name, rss.report(name))
    assert tally.valid_sends > 0 and tally.refused > 0
    assert set(OPENING_KINDS) <= kinds.keys(), set(OPENING_KINDS) - kinds.keys()
    assert [s["broker_id"] for s in stats["replication"]["slaves"]] == \
        [int(auth_group.slave.env["FERRY_BROKER_ID"])]
    assert stats["auth"]["refused_unauthenticated"] > before["refused_unauthenticated"]
    assert stats["auth"]["refused_denied"] > before["refused_denied"]

"""The replication link with auth on: a slave must sign its HELLO (AUTH frame, sent first) for
this master as an identity granted `replicate` on its broker id; a master with auth off ignores
the AUTH frame."""
from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from ferry.auth.acl import Rule
from ferry.auth.credentials import Credentials
from ferry.auth.signing import sign_repl
from ferry.routing import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry, User
from ferry_broker.auth import BrokerAuth
from ferry_broker.config import BrokerConfig
from ferry_broker.replication import protocol as p

from tests.broker.repl_support import CLUSTER, NAME, Master, Slave, open_master, open_slave, until

REPLICA = Credentials("broker-b", "broker-b-secret-0123456789")
READER = Credentials("reader", "reader-secret-0123456789")


def broker_auth() -> BrokerAuth:
    """A BrokerAuth over identities set in memory (the etcd side is tested elsewhere)."""
    registry = AuthRegistry(EtcdRegistry("127.0.0.1:1"))
    for creds, rules in ((REPLICA, [Rule("allow", "broker:broker-a/*", ("replicate",))]),
                         (READER, [Rule("allow", "admin", ("read",))])):
        registry.users[creds.access_key] = User(creds.access_key, creds.signing_key, 0)
        registry.acl.set_rules(creds.access_key, rules)
    auth = BrokerAuth(BrokerConfig(etcd=""), registry)
    auth.loaded = True
    return auth


@pytest.fixture
async def master(tmp_path: Path) -> AsyncIterator[Master]:
    m = open_master(tmp_path / "master")
    m.auth = broker_auth()
    await m.start()
    yield m
    assert m.server is not None
    await m.server.stop()
    m.store.close()


@pytest.fixture
async def slaves(tmp_path: Path) -> AsyncIterator[list[Slave]]:
    made: list[Slave] = []
    yield made
    for s in made:
        await s.follower.stop()
        s.store.close()


def slave(made: list[Slave], root: Path, credentials: Credentials | None) -> Slave:
    s = open_slave(root, broker_id=len(made) + 1)
    s.follower.credentials = credentials
    made.append(s)
    return s


@pytest.mark.parametrize("credentials", [None, READER, Credentials("broker-b", "wrong-secret-"
                                                                           "0123456789")],
                         ids=["unsigned", "not-permitted", "wrong-secret"])
async def test_slaves_without_the_right_identity_are_refused(
        master: Master, slaves: list[Slave], tmp_path: Path,
        credentials: Credentials | None) -> None:
    assert master.server is not None
    master.put(5, random.Random(1))
    refused = slave(slaves, tmp_path / "refused", credentials)
    await refused.follower.follow(master.addr, 1, 0)
    await asyncio.sleep(0.5)  # a few refused attempts (not a timing assertion)
    assert refused.follower.status()["connected"] is False and not master.server.slaves()
    # The master goes on serving a slave with the right identity.
    good = slave(slaves, tmp_path / "good", REPLICA)
    await good.follower.follow(master.addr, 1, 0)
    await until(lambda: good.store.commit_log_max_offset == master.store.commit_log_max_offset)


async def test_a_master_with_auth_off_ignores_the_auth_frame(
        tmp_path: Path, slaves: list[Slave]) -> None:
    m = open_master(tmp_path / "open-master")
    await m.start()
    try:
        m.put(5, random.Random(2))
        s = slave(slaves, tmp_path / "signed", REPLICA)
        await s.follower.follow(m.addr, 1, 0)
        await until(lambda: s.store.commit_log_max_offset == m.store.commit_log_max_offset)
        m.put(3, random.Random(3))   # acks keep flowing after the ignored AUTH frame
        await until(lambda: s.store.commit_log_max_offset == m.store.commit_log_max_offset)
    finally:
        assert m.server is not None
        await m.server.stop()
        m.store.close()


def _opening(credentials: Credentials, master_id: int, signed_id: int, sent_id: int) -> bytes:
    """An AUTH signed for master `master_id` over the HELLO of broker `signed_id`, then the
    HELLO of broker `sent_id`."""
    def payload(broker_id: int) -> bytes:
        return b"".join(p.encode_hello(p.Hello(p.MAGIC, p.VERSION, broker_id, 1, 0, CLUSTER,
                                               NAME, [])))[p.LENGTH.size + p.TYPE.size:]
    digest = hashlib.sha256(payload(signed_id)).digest()
    s = sign_repl(credentials, p.master_target(CLUSTER, NAME, master_id), digest)
    return b"".join([*p.encode_auth(s.access_key, s.ts_ms, s.nonce, s.signature, digest),
                     *p.frame(p.FrameType.HELLO, payload(sent_id))])


@pytest.mark.parametrize(("master_id", "sent_id", "reason"), [
    (0, 1, None),
    (5, 1, "bad signature"),                    # signed for another master
    (0, 2, "not the one the AUTH frame signed"),  # another HELLO than the one signed
], ids=["as-signed", "other-master", "other-hello"])
async def test_an_auth_frame_holds_for_one_master_and_one_hello(
        master: Master, master_id: int, sent_id: int, reason: str | None) -> None:
    assert master.server is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", master.server.port)
    try:
        writer.write(_opening(REPLICA, master_id, 1, sent_id))
        ftype, payload = await asyncio.wait_for(p.read_frame(reader), 10)
    finally:
        writer.close()
    if reason is None:
        assert ftype is p.FrameType.WELCOME
    else:
        assert ftype is p.FrameType.REFUSE and reason in p.decode_refuse(payload)[1]

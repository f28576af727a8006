"""The fuzz tests' auth-on brokers, over identities seeded in etcd: a lone broker (the wire
fuzz) and a group of a master and its slave with sync replication (the replication fuzz).

The wire fuzz has a broker of its own: a full run keeps a master so busy on this 2-core
machine that it lost its etcd lease (TTL 15 s) and stepped down, which is a failover, not
the fuzz's question."""
from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from ferry.auth.acl import ACTIONS
from ferry.auth.credentials import Credentials
from ferry.auth.http import signed_url_headers

from tests.broker.auth_support import ADMIN_RULES, creds, rules, seed
from tests.broker.conftest import Broker, start_broker, unique_prefix
from tests.broker.roles_support import start_member
from tests.support.procs import Etcd, free_port

VALID_TOPIC, VALID_GROUP = "fuzz-valid", "fuzz-valid-g"
#: The well-behaved client: its own topic and group, nothing else.
VALID = creds("fuzz-valid")
#: Reads /v1/stats (admin read) for the checks; sends nothing.
STATS = creds("fuzz-stats")
#: Few rights: a valid signature that is mostly refused (AccessDeniedError).
FEW = creds("fuzz-few")
FEW_RULES = rules(("allow", "topic:fuzz-a", "pub"), ("allow", "topic:fuzz-b", "sub"),
                  ("allow", "group:fg-a", "consume"))
#: Every right: its hostile frames reach the handlers, as with auth off.
WIDE = creds("fuzz-wide")
#: The brokers' own identity: what a slave signs its AUTH with; `replicate` on its group
#: (issue 24 binds it to broker ids: a `broker:<name>/<id>` resource), else admin.
REPLICA = creds("fuzz-replica")
REPLICA_RULE = (("allow", "broker:broker-a/*", "replicate") if "broker" in ACTIONS
                else ("allow", "admin", "replicate"))
IDENTITIES = {
    VALID.access_key: rules(("allow", f"topic:{VALID_TOPIC}", "pub,sub"),
                            ("allow", f"group:{VALID_GROUP}", "consume")),
    STATS.access_key: rules(("allow", "admin", "read")),
    FEW.access_key: FEW_RULES,
    WIDE.access_key: ADMIN_RULES,
    REPLICA.access_key: rules(REPLICA_RULE),
}
READY_TIMEOUT_S = 30.0


@dataclass
class AuthGroup:
    """The group under fuzz: its master (wire and replication ports) and its slave."""

    master: Broker
    slave: Broker
    repl_ports: dict[int, int]   # broker id -> replication port

    @property
    def master_repl_port(self) -> int:
        return self.repl_ports[int(self.master.env["FERRY_BROKER_ID"])]

    def stats(self, broker: Broker | None = None) -> dict[str, Any]:
        return signed_stats(broker or self.master, STATS)


def signed_stats(broker: Broker, credentials: Credentials | None) -> dict[str, Any]:
    """A broker's /v1/stats, signed when `credentials` are given (auth on needs admin read)."""
    url = broker.http + "/v1/stats"
    req = urllib.request.Request(url, headers=signed_url_headers(credentials, "GET", url))
    with urllib.request.urlopen(req, timeout=5) as resp:
        return dict(json.loads(resp.read()))


def _replication(b: Broker) -> dict[str, Any]:
    try:
        return dict(signed_stats(b, STATS)["replication"])
    except OSError:
        return {}


def _wait_linked(members: list[Broker]) -> tuple[Broker, Broker]:
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        for m in members:
            r = _replication(m)
            if r.get("role") == "master" and r.get("writable") and r.get("slaves"):
                return m, next(x for x in members if x is not m)
        time.sleep(0.2)
    raise RuntimeError("the auth-on group has no master with a linked slave: "
                       + "\n".join(m.proc.log()[-2000:] for m in members))


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[Broker]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    b = start_broker(tmp_path_factory.mktemp("auth-fuzz-broker"), etcd, prefix=prefix,
                     FERRY_AUTH="on", FERRY_BROKER_LOG_LEVEL="WARNING",
                     FERRY_BROKER_MAX_PULL_WAIT_MS="500")
    yield b
    b.proc.stop()
    print(b.proc.log()[-3000:])


@pytest.fixture(scope="module")
def auth_group(tmp_path_factory: pytest.TempPathFactory, etcd: Etcd) -> Iterator[AuthGroup]:
    prefix = unique_prefix()
    seed(etcd.endpoint, prefix, IDENTITIES)
    workdir = tmp_path_factory.mktemp("fuzz-group")
    repl_ports = {0: free_port(), 1: free_port()}
    # WARNING: each refused request is an INFO line, a million of them would be the run.
    env = {"FERRY_AUTH": "on", "FERRY_BROKER_ACCESS_KEY": REPLICA.access_key,
           "FERRY_BROKER_SECRET_KEY": REPLICA.secret_key, "FERRY_BROKER_LOG_LEVEL": "WARNING",
           "FERRY_BROKER_MAX_PULL_WAIT_MS": "500",
           # A master busy with a million frames must not lose its lease on the way.
           "FERRY_BROKER_ELECTION_TTL_S": "15"}
    members: list[Broker] = []
    try:
        for broker_id, port in repl_ports.items():
            members.append(start_member(workdir, etcd, prefix, broker_id, "sync",
                                        FERRY_BROKER_REPL_PORT=str(port), **env))
        master, slave = _wait_linked(members)
        yield AuthGroup(master, slave, repl_ports)
    finally:
        for m in members:
            m.proc.stop()
        for m in members:
            print(m.proc.log()[-3000:])

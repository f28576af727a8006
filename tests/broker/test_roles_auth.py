"""A broker group with FERRY_AUTH=on on real processes: a slave follows its master only under
an identity granted `replicate` on its broker id (its own FERRY_BROKER_ACCESS_KEY)."""
from __future__ import annotations

from typing import Any

import pytest

from tests.broker import roles_support
from tests.broker.auth_support import ADMIN_RULES, rules, seed_async
from tests.broker.conftest import Broker
from tests.broker.roles_support import eventually, identity
from tests.support.procs import Etcd

group, prefix = roles_support.group, roles_support.prefix  # fixtures

pytestmark = pytest.mark.integration

IDENTITIES = {"root": ADMIN_RULES,
              "replica": rules(("allow", "broker:broker-a/*", "replicate")),
              "not-a-replica": rules(("allow", "topic:*", "pub,sub"))}


def replication(broker: Broker) -> dict[str, Any]:
    """The broker's replication status, read as root (its /v1/stats needs admin read)."""
    return roles_support.replication(broker, "root")


def is_master(b: Broker) -> bool:
    r = replication(b)
    return r["role"] == "master" and r["writable"]


def connected(b: Broker) -> bool:
    return bool(replication(b).get("follower", {}).get("connected", False))


async def test_only_a_replicate_identity_follows(group: Any, etcd: Etcd, prefix: str) -> None:
    await seed_async(etcd.endpoint, prefix, IDENTITIES)
    first = group(0, **identity("replica"))
    await eventually(lambda: is_master(first))
    outsider = group(1, **identity("not-a-replica"))
    follower = group(2, **identity("replica"))
    await eventually(lambda: connected(follower))
    assert not connected(outsider)
    assert "may not 'replicate'" in first.proc.log()

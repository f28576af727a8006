"""A broker group with FERRY_AUTH=on on real processes: a slave follows its master only under
an identity with admin `replicate` (its own FERRY_BROKER_ACCESS_KEY)."""
from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from ferry.auth.http import signed_url_headers

from tests.broker import roles_support
from tests.broker.auth_support import ADMIN_RULES, creds, rules, seed_async
from tests.broker.conftest import Broker
from tests.broker.roles_support import eventually
from tests.support.procs import Etcd

group, prefix = roles_support.group, roles_support.prefix  # fixtures

pytestmark = pytest.mark.integration

IDENTITIES = {"root": ADMIN_RULES,
              "replica": rules(("allow", "admin", "replicate")),
              "not-a-replica": rules(("allow", "topic:*", "pub,sub"))}


def identity(access_key: str) -> dict[str, str]:
    c = creds(access_key)
    return {"FERRY_AUTH": "on", "FERRY_BROKER_ACCESS_KEY": c.access_key,
            "FERRY_BROKER_SECRET_KEY": c.secret_key}


def replication(broker: Broker) -> dict[str, Any]:
    """The broker's replication status, read as root (its /v1/stats needs admin read)."""
    url = broker.http + "/v1/stats"
    req = urllib.request.Request(url, headers=signed_url_headers(creds("root"), "GET", url))
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())["replication"]


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

"""Turning auth on with no open window, and rule writes that lose nothing (issue 24).

Real etcd and namesrv processes: with auth off namesrv refuses every identity and
rule route (nobody who reaches it can make an admin that outlives the switch);
the bootstrap path (`ferry user|acl ... --etcd`) makes the identities, which work
once namesrv restarts with FERRY_AUTH=on. Many grants on one identity at once,
through two namesrv processes, all land.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import aiohttp
import pytest
from ferry.auth.acl import Rule
from ferry.auth.credentials import Credentials
from ferry.auth.http import client_session
from ferry.client.core.namesrv import NamesrvClient
from ferry.errors import AccessDeniedError
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry
from ferry_namesrv.permissions import ROUTES

from tests.auth.http_support import ADMIN, NOBODY, auth_env, fill, seed_identities
from tests.support.procs import Etcd, Proc, start_namesrv

pytestmark = pytest.mark.integration

FERRY = str(Path(sys.executable).with_name("ferry"))
#: namesrv's identity and rule routes: (method, filled path).
IDENTITY_ROUTES = sorted((m, fill(p)) for m, p in ROUTES
                         if p.startswith(("/v1/users", "/v1/acl")))
#: A body each route would accept with auth on (an admin named `intruder`).
BODIES = {("POST", "/v1/users"): {"access_key": "intruder", "signing_key": "ab" * 32,
                                  "admin": True},
          ("PUT", "/v1/acl/nobody"): {"rules": [{"effect": "allow", "resource": "admin",
                                                 "actions": ["*"]}]},
          ("POST", "/v1/acl/nobody"): {"rules": [{"effect": "allow", "resource": "admin",
                                                  "actions": ["*"]}]}}


def _ferry(namesrv: str, *args: str, as_: tuple[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_ACCESS_KEY", "FERRY_SECRET_KEY")}
    env["FERRY_NAMESRV"] = namesrv
    if as_ is not None:
        env["FERRY_ACCESS_KEY"], env["FERRY_SECRET_KEY"] = as_
    return subprocess.run([FERRY, *args], capture_output=True, text=True, timeout=60, env=env,
                          check=False)


async def _access_keys(etcd: Etcd, prefix: str) -> set[str]:
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    try:
        return {u.access_key for u in await AuthRegistry(registry).list_users()}
    finally:
        await registry.stop()


@pytest.fixture
def prefix() -> str:
    return f"/boot-{uuid4().hex[:8]}/"


@pytest.fixture
def auth_off(etcd: Etcd, prefix: str, tmp_path: Path) -> Iterator[str]:
    """A namesrv with auth off (the default) over `prefix`: its address."""
    proc: Proc
    proc, port = start_namesrv(etcd.endpoint, prefix, tmp_path / "ns-off")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        proc.stop()


async def test_with_auth_off_every_identity_and_rule_route_is_refused(
        etcd: Etcd, prefix: str, auth_off: str) -> None:
    """403 with the way to do it instead, unsigned or signed by a real admin alike; nothing is
    written, and namesrv goes on serving everything else."""
    await seed_identities(etcd.endpoint, prefix, {ADMIN: (), NOBODY: ()})
    assert len(IDENTITY_ROUTES) == 9
    base = "http://" + auth_off
    timeout = aiohttp.ClientTimeout(total=15)
    async with aiohttp.ClientSession(timeout=timeout) as plain, \
            client_session(ADMIN, timeout=timeout) as signed:
        for session in (plain, signed):
            for method, path in IDENTITY_ROUTES:
                async with session.request(method, base + path,
                                           json=BODIES.get((method, path))) as resp:
                    doc = await resp.json()
                assert resp.status == 403, (method, path, doc)
                assert doc["error"]["type"] == "AccessDeniedError", (method, path, doc)
                message = doc["error"]["message"]
                assert "FERRY_AUTH=on" in message and "--etcd" in message, message
        async with plain.get(base + "/v1/topics") as resp:
            assert resp.status == 200
    assert await _access_keys(etcd, prefix) == {ADMIN.access_key, NOBODY.access_key}
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    try:
        assert await AuthRegistry(registry).get_rules(NOBODY.access_key) == ()
    finally:
        await registry.stop()


def test_the_bootstrap_path_makes_identities_that_work_once_auth_is_on(
        etcd: Etcd, prefix: str, auth_off: str, tmp_path: Path) -> None:
    """The documented order: identities straight in etcd while auth is off (namesrv refuses
    them meanwhile), then FERRY_AUTH=on and a restart; they sign and hold their rules."""
    on_etcd = ("--etcd", etcd.endpoint, "--etcd-prefix", prefix)
    res = _ferry(auth_off, "user", "add", "root", "--admin", "--bootstrap", *on_etcd)
    assert res.returncode == 0, res.stderr
    root = ("root", next(line for line in res.stdout.splitlines()
                         if line.startswith("secret: ")).removeprefix("secret: "))
    app_secret = tmp_path / "app.secret"
    app_secret.write_text("app-secret-0123456789\n")
    res = _ferry(auth_off, "user", "add", "app", "--secret-file", str(app_secret), *on_etcd)
    assert res.returncode == 0, res.stderr
    res = _ferry(auth_off, "acl", "grant", "app", "--topic", "orders", "--perm", "pub", *on_etcd)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["rules"] == [
        {"effect": "allow", "resource": "topic:orders", "actions": ["pub"]}]
    # ... while anyone going through namesrv is refused, signed or not.
    for as_ in (None, root):
        res = _ferry(auth_off, "user", "add", "sneaky", "--admin", as_=as_)
        assert res.returncode == 1 and "AccessDeniedError" in res.stderr, res.stderr
    assert asyncio.run(_access_keys(etcd, prefix)) == {"root", "app"}

    proc, port = start_namesrv(etcd.endpoint, prefix, tmp_path / "ns-on",
                               auth_env(etcd.endpoint, prefix))
    try:
        on = f"127.0.0.1:{port}"
        listed = _ferry(on, "user", "list", as_=root)
        assert listed.returncode == 0, listed.stderr
        assert {u["access_key"] for u in json.loads(listed.stdout)["users"]} == {"root", "app"}
        app = ("app", "app-secret-0123456789")
        asyncio.run(_route_as_app(on, app))
        res = _ferry(on, "user", "add", "later", as_=root)   # through namesrv now
        assert res.returncode == 0, res.stderr
        assert _ferry(on, "user", "add", "sneaky", as_=app).returncode == 1
    finally:
        proc.stop()
    assert asyncio.run(_access_keys(etcd, prefix)) == {"root", "app", "later"}


async def _route_as_app(namesrv: str, app: tuple[str, str]) -> None:
    """`app` may find the route of the topic it was granted, and nothing beyond it."""
    client = NamesrvClient(namesrv, credentials=Credentials(*app))
    await client.start()
    try:
        await client.call("GET", "/v1/routes/orders", params={"create": "true"})
        with pytest.raises(AccessDeniedError, match="users on admin"):
            await client.call("GET", "/v1/users")
    finally:
        await client.close()


async def test_concurrent_grants_on_one_identity_all_land(
        etcd: Etcd, prefix: str, tmp_path: Path) -> None:
    """60 grants at once on one identity through two namesrv processes: every rule is there
    (a read-modify-write lost some), and a revoke among them removes only its own rule."""
    await seed_identities(etcd.endpoint, prefix, {ADMIN: (), NOBODY: ()})
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    auth = AuthRegistry(registry)
    await auth.set_rules(ADMIN.access_key, (Rule("allow", "admin", ("users",)),))
    await auth.set_rules(NOBODY.access_key, (Rule("allow", "topic:gone", ("pub",)),))
    procs = [start_namesrv(etcd.endpoint, prefix, tmp_path / f"ns-{i}",
                           auth_env(etcd.endpoint, prefix)) for i in range(2)]
    clients = [NamesrvClient(f"127.0.0.1:{port}", credentials=ADMIN) for _, port in procs]
    try:
        for client in clients:
            await client.start()

        async def grant(i: int) -> None:
            rule = {"effect": "allow", "resource": f"topic:t-{i}", "actions": ["pub"]}
            await clients[i % 2].call("POST", f"/v1/acl/{NOBODY.access_key}",
                                      json={"rules": [rule]})

        async def revoke() -> None:
            await clients[1].call("DELETE", f"/v1/acl/{NOBODY.access_key}",
                                  params={"resource": "topic:gone"})

        await asyncio.gather(*(grant(i) for i in range(30)), revoke(),
                             *(grant(i) for i in range(30, 60)))
        rules = await auth.get_rules(NOBODY.access_key)
        assert sorted(r.resource for r in rules) == sorted(f"topic:t-{i}" for i in range(60))
    finally:
        for client in clients:
            await client.close()
        for proc, _ in procs:
            proc.stop()
        await registry.stop()

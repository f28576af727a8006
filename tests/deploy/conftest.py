"""What deploy/'s tests on real processes share: a mesh with auth on (namesrv, one broker,
the console) whose identities include the compose file's service identities, each with
the rules deploy/auth_init.py gives it."""
from __future__ import annotations

import asyncio
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
from ferry.auth.credentials import Credentials

from tests.auth.http_support import ADMIN, RULES, auth_env, seed_identities
from tests.client.conftest import Mesh
from tests.console.test_login import start_secured_console
from tests.support.procs import Etcd, Proc

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def auth_init() -> ModuleType:
    """deploy/auth_init.py (a script, not a package module)."""
    spec = importlib.util.spec_from_file_location("auth_init", DEPLOY / "auth_init.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_identity(access_key: str) -> Credentials:
    """A compose service identity with a test secret (its rules: auth_init.SERVICES)."""
    return Credentials(access_key, f"{access_key}-test-secret-0123456789")


@dataclass
class Secured:
    mesh: Mesh
    namesrv: str     # host:port of each service's HTTP API
    broker: str
    console: str


@pytest.fixture(scope="package")
def secured(etcd: Etcd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    mesh = Mesh(etcd, tmp_path_factory.mktemp("deploy-secured"), credentials=ADMIN)
    services = auth_init().SERVICES
    asyncio.run(seed_identities(etcd.endpoint, mesh.prefix, {
        **RULES, **{compose_identity(key): services[key]
                    for key in ("svc-metrics", "svc-celery-worker")}}))
    mesh.namesrv_env = auth_env(etcd.endpoint, mesh.prefix)
    console: Proc | None = None
    try:
        mesh.start_namesrv()
        mesh.broker_env = {"FERRY_AUTH": "on"}
        broker = mesh.start_broker("broker-a")
        console, url = start_secured_console(mesh, "console")
        yield Secured(mesh, mesh.namesrv, f"127.0.0.1:{broker.http_port}",
                      url.removeprefix("http://"))
    finally:
        if console is not None:
            console.stop()
        mesh.stop()

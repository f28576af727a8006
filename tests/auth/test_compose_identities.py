"""The compose mesh's first start with auth on: deploy/auth_init.py against a real etcd, and
deploy/with-identity.sh handing a service its own secret."""
from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import pytest
from ferry.auth.credentials import derive_signing_key
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry

from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KEYS = ("admin", "svc-broker-a-0", "svc-broker-a-1", "svc-broker-b-0", "svc-broker-b-1",
        "svc-delay-scheduler", "svc-txn-checker", "svc-dedup",
        "svc-console", "svc-spark")


def _init(etcd: Etcd, prefix: str, secrets: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(DEPLOY / "auth_init.py"), "--etcd", etcd.endpoint,
                           "--etcd-prefix", prefix, "--secrets-dir", str(secrets)],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


async def _users(etcd: Etcd, prefix: str) -> dict[str, bytes]:
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    try:
        return {u.access_key: u.signing_key for u in await AuthRegistry(registry).list_users()}
    finally:
        await registry.stop()


def test_auth_init_creates_every_identity_once(etcd: Etcd, tmp_path: Path) -> None:
    prefix, secrets = f"/init-{uuid4().hex[:8]}/", tmp_path / "secrets"
    done = _init(etcd, prefix, secrets, FERRY_ADMIN_SECRET="the-admins-chosen-secret")
    assert done.returncode == 0, done.stderr
    assert "the-admins-chosen-secret" not in done.stdout + done.stderr, "secrets never printed"
    users = asyncio.run(_users(etcd, prefix))
    assert set(users) == set(KEYS)
    for key in KEYS:
        path = secrets / key
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert users[key] == derive_signing_key(key, path.read_text()), key
    assert (secrets / "admin").read_text() == "the-admins-chosen-secret"
    again = _init(etcd, prefix, secrets)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    (secrets / "svc-dedup").unlink()
    lost = _init(etcd, prefix, secrets)
    assert lost.returncode == 1 and "svc-dedup" in lost.stderr


async def _remove_user(etcd: Etcd, prefix: str, access_key: str) -> None:
    registry = EtcdRegistry(etcd.endpoint, prefix=prefix)
    await registry.start()
    try:
        await AuthRegistry(registry).remove_user(access_key)
    finally:
        await registry.stop()


def test_auth_init_adds_a_service_identity_new_since_the_first_start(
        etcd: Etcd, tmp_path: Path) -> None:
    """An upgraded mesh: etcd has the identities of an older release, not svc-spark."""
    prefix, secrets = f"/init-{uuid4().hex[:8]}/", tmp_path / "secrets"
    assert _init(etcd, prefix, secrets).returncode == 0
    asyncio.run(_remove_user(etcd, prefix, "svc-spark"))
    (secrets / "svc-spark").unlink()
    before = {k: (secrets / k).read_text() for k in KEYS if k != "svc-spark"}
    upgraded = _init(etcd, prefix, secrets)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "created svc-spark" in upgraded.stdout
    users = asyncio.run(_users(etcd, prefix))
    assert set(users) == set(KEYS)
    assert users["svc-spark"] == derive_signing_key("svc-spark",
                                                    (secrets / "svc-spark").read_text())
    assert all((secrets / k).read_text() == v for k, v in before.items()), "others untouched"


def test_with_identity_runs_the_service_with_its_secret(tmp_path: Path) -> None:
    (tmp_path / "svc-console").write_text("console-secret-0123456789")
    done = subprocess.run(["sh", str(DEPLOY / "with-identity.sh"), "svc-console", "env"],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "FERRY_AUTH_SECRETS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "FERRY_ACCESS_KEY=svc-console\n" in done.stdout
    assert "FERRY_SECRET_KEY=console-secret-0123456789\n" in done.stdout

"""The compose mesh's first start with auth on: deploy/auth_init.py against a real etcd,
deploy/with-identity.sh handing a service its own secret, and the compose file and images
holding what that relies on: each container mounts only its own identity's secret, no
image runs as root, Redis and PostgreSQL have generated passwords and, like Jaeger (no
authentication at all), no published port."""
from __future__ import annotations

import asyncio
import os
import re
import stat
import subprocess
import sys
from pathlib import Path
from uuid import uuid4

import pytest
import yaml
from ferry.auth.credentials import derive_signing_key
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry

from tests.support.procs import Etcd

pytestmark = pytest.mark.integration

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
KEYS = ("admin", "svc-broker-a-0", "svc-broker-a-1", "svc-broker-b-0", "svc-broker-b-1",
        "svc-delay-scheduler", "svc-txn-checker", "svc-dedup",
        "svc-console", "svc-spark", "svc-celery-worker", "svc-metrics")
#: The generated passwords of the images that are not Ferry's (each read by its own user).
PASSWORDS = ("redis", "postgres", "grafana")


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
        path = secrets / key / key   # a directory (a volume) of its own per identity
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert users[key] == derive_signing_key(key, path.read_text()), key
    assert (secrets / "admin" / "admin").read_text() == "the-admins-chosen-secret"
    assert sorted(p.name for p in secrets.iterdir()) == sorted((*KEYS, *PASSWORDS))
    assert sorted(p.name for p in (secrets / "admin").iterdir()) == ["admin"]
    passwords = _backing_passwords(secrets)
    again = _init(etcd, prefix, secrets)
    assert again.returncode == 0 and "nothing to do" in again.stdout
    assert _backing_passwords(secrets) == passwords, "kept: postgres takes it only once"
    (secrets / "svc-dedup" / "svc-dedup").unlink()
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
    (secrets / "svc-spark" / "svc-spark").unlink()
    before = {k: (secrets / k / k).read_text() for k in KEYS if k != "svc-spark"}
    upgraded = _init(etcd, prefix, secrets)
    assert upgraded.returncode == 0, upgraded.stderr
    assert "created svc-spark" in upgraded.stdout
    users = asyncio.run(_users(etcd, prefix))
    assert set(users) == set(KEYS)
    assert users["svc-spark"] == derive_signing_key(
        "svc-spark", (secrets / "svc-spark" / "svc-spark").read_text())
    assert all((secrets / k / k).read_text() == v for k, v in before.items()), "others untouched"


def _backing_passwords(secrets: Path) -> dict[str, str]:
    """Redis's, PostgreSQL's and Grafana's passwords as auth-init left them, checked:
    generated (no default), readable by those images' own users, in Redis's config and
    dedup's URLs."""
    out = {name: (secrets / name / "password").read_text() for name in PASSWORDS}
    assert len(set(out.values())) == len(PASSWORDS), "one password each"
    for name, password in out.items():
        assert re.fullmatch(r"[0-9a-f]{48}", password), name
        assert stat.S_IMODE((secrets / name / "password").stat().st_mode) == 0o644
    conf = (secrets / "redis" / "redis.conf").read_text()
    assert f"requirepass {out['redis']}\n" in conf and "appendonly yes" in conf
    env = secrets / "svc-dedup" / "env"
    assert stat.S_IMODE(env.stat().st_mode) == 0o600
    assert env.read_text() == (
        f"FERRY_DEDUP_REDIS=redis://:{out['redis']}@redis:6379/0\n"
        f"FERRY_DEDUP_LEDGER_URL=postgresql://ferry:{out['postgres']}@postgres:5432/ferry\n")
    return out


def test_with_identity_runs_the_service_with_its_secret(tmp_path: Path) -> None:
    (tmp_path / "svc-console").write_text("console-secret-0123456789")
    done = subprocess.run(["sh", str(DEPLOY / "with-identity.sh"), "svc-console", "env"],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "FERRY_AUTH_SECRETS_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "FERRY_ACCESS_KEY=svc-console\n" in done.stdout
    assert "FERRY_SECRET_KEY=console-secret-0123456789\n" in done.stdout


def test_with_identity_exports_the_settings_auth_init_wrote(tmp_path: Path) -> None:
    """dedup's Redis and ledger URLs (with their passwords) come from the env file of its own
    secret volume; a line that sets no FERRY_ variable is not exported."""
    (tmp_path / "svc-dedup").write_text("dedup-secret-0123456789")
    (tmp_path / "env").write_text("FERRY_DEDUP_REDIS=redis://:pw@redis:6379/0\n"
                                  "PATH=/nowhere\nFERRY_DEDUP_LEDGER_URL=postgresql://f:pw@pg/f")
    done = subprocess.run(["sh", str(DEPLOY / "with-identity.sh"), "svc-dedup", "env"],
                          capture_output=True, text=True, timeout=30,
                          env={"PATH": os.environ["PATH"], "FERRY_AUTH_SECRETS_DIR": str(tmp_path),
                               "FERRY_DEDUP_REDIS": "redis://redis:6379/0"})
    assert done.returncode == 0, done.stderr
    assert "FERRY_DEDUP_REDIS=redis://:pw@redis:6379/0\n" in done.stdout
    assert "FERRY_DEDUP_LEDGER_URL=postgresql://f:pw@pg/f\n" in done.stdout
    assert "PATH=/nowhere" not in done.stdout and "sets no FERRY_ variable" in done.stderr


COMPOSE = DEPLOY / "docker-compose.yml"
#: The identity each container runs as (with-identity.sh's first argument).
IDENTITY_OF = {"broker-a": "svc-broker-a-0", "broker-a-1": "svc-broker-a-1",
               "broker-b": "svc-broker-b-0", "broker-b-1": "svc-broker-b-1", "delay-scheduler": "svc-delay-scheduler",
               "delay-scheduler-1": "svc-delay-scheduler", "txn-checker": "svc-txn-checker",
               "txn-checker-1": "svc-txn-checker", "dedup": "svc-dedup",
               "console": "svc-console", "spark": "svc-spark", "worker": "svc-celery-worker",
               "metrics-proxy": "svc-metrics"}


def _services() -> dict[str, dict[str, object]]:
    """The services as Compose runs them (`docker-compose config`: anchors and merges applied)."""
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE), "config"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout)["services"])


def _secret_volumes(svc: dict[str, object]) -> set[str]:
    volumes = svc.get("volumes") or []
    assert isinstance(volumes, list)
    names = {(v if isinstance(v, str) else v["source"]).split(":")[0] for v in volumes}
    return {n for n in names if n.startswith("secret-")}


def test_each_container_mounts_only_its_own_identitys_secret() -> None:
    """The admin's secret is mounted by auth-init alone; a service sees its own identity's
    volume and no other (namesrv, etcd and Jaeger none), Redis and PostgreSQL their password's."""
    services = _services()
    everything = {f"secret-{k}" for k in KEYS} | {f"secret-{n}" for n in PASSWORDS}
    assert _secret_volumes(services["auth-init"]) == everything
    for name, svc in services.items():
        mounted = _secret_volumes(svc)
        if name == "auth-init":
            continue
        assert "secret-admin" not in mounted, name
        if name in IDENTITY_OF:
            assert mounted == {f"secret-{IDENTITY_OF[name]}"}, (name, mounted)
            command = svc["command"]
            assert isinstance(command, list) and command[1] == IDENTITY_OF[name], name
        elif name in PASSWORDS:
            assert mounted == {f"secret-{name}"}, (name, mounted)
        else:
            assert mounted == set(), (name, mounted)
    assert set(IDENTITY_OF) | {"auth-init", *PASSWORDS, "namesrv", "etcd", "jaeger",
                               "prometheus"} == set(services)


def test_no_unauthenticated_store_or_tracing_port_is_published() -> None:
    """etcd, Redis, PostgreSQL, Jaeger (UI and OTLP), Prometheus and the metrics proxy
    (which lends its identity's read right) are reached on the compose network only;
    Redis and PostgreSQL also need the generated passwords, never ferry/ferry. Grafana,
    published for operators, takes its admin password from its secret volume, with no
    sign-up and no anonymous access."""
    services = _services()
    for name in ("etcd", "redis", "postgres", "jaeger", "prometheus", "metrics-proxy"):
        assert not services[name].get("ports"), name
    grafana = services["grafana"]["environment"]
    assert isinstance(grafana, dict)
    assert grafana["GF_SECURITY_ADMIN_PASSWORD__FILE"] == "/run/ferry-auth/password"
    assert "GF_SECURITY_ADMIN_PASSWORD" not in grafana
    assert grafana["GF_USERS_ALLOW_SIGN_UP"] == "false"
    assert grafana["GF_AUTH_ANONYMOUS_ENABLED"] == "false"
    assert services["redis"]["command"] == ["redis-server", "/run/ferry-auth/redis.conf"]
    pg_env = services["postgres"]["environment"]
    assert isinstance(pg_env, dict)
    assert pg_env["POSTGRES_PASSWORD_FILE"] == "/run/ferry-auth/password"
    assert "POSTGRES_PASSWORD" not in pg_env
    assert "ferry:ferry" not in COMPOSE.read_text()
    healthcheck = services["redis"]["healthcheck"]
    assert isinstance(healthcheck, dict) and "REDISCLI_AUTH" in " ".join(healthcheck["test"])


def test_no_ferry_image_runs_as_root() -> None:
    """Both images end as the `ferry` user (uid 10001), and no service puts root back."""
    for dockerfile in ("Dockerfile", "Dockerfile.spark"):
        lines = [line.split() for line in (DEPLOY / dockerfile).read_text().splitlines()
                 if line and not line.startswith("#")]
        users = [i for i, words in enumerate(lines) if words[0] == "USER"]
        assert users and lines[users[-1]][1] == "ferry", dockerfile
        assert all(words[0] != "RUN" for words in lines[users[-1]:]), dockerfile
        assert "--uid 10001" in (DEPLOY / dockerfile).read_text(), dockerfile
    for name, svc in _services().items():
        assert str(svc.get("user", "")) not in ("root", "0", "0:0"), name

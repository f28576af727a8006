"""First start of the compose mesh with auth on: the admin, one identity per service, and
the passwords of Redis and PostgreSQL.

Run once by the `auth-init` service of deploy/docker-compose.yml, before the
Ferry services (each waits for its secret file, see with-identity.sh). While
etcd holds no identity it creates, directly in etcd (as `ferry user add
--bootstrap` does):

- `admin` with every right; its secret is FERRY_ADMIN_SECRET when set, else
  generated;
- one identity per service with exactly the rights it needs (SERVICES below),
  with generated secrets;

and writes each secret to `<secrets dir>/<access key>/<access key>` (mode
0600): each such directory is a volume of its own, mounted by that identity's
containers only (the admin's by none but auth-init). It also generates, once,
Redis's password (`redis/redis.conf`, `redis/password`), PostgreSQL's
(`postgres/password`) and Grafana's admin password (`grafana/password`),
readable by those containers' own users (mode 0644 in volumes no other container
mounts), and hands Redis's and PostgreSQL's to dedup in
`svc-dedup/env` (its Redis and ledger URLs; with-identity.sh exports them).
On a later start it checks that the secret files are there and creates only
the service identities added since (an upgraded mesh). Secrets are never
printed; read the admin's with
`docker compose -f deploy/docker-compose.yml run --rm --no-deps auth-init cat /run/ferry-auth/admin/admin`.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import sys
from pathlib import Path

from ferry.auth.acl import Rule, admin_rules
from ferry.auth.credentials import Credentials, generate_secret
from ferry.routing.registry import EtcdRegistry
from ferry.service.auth_registry import AuthRegistry

ADMIN = "admin"
#: Each service's identity and its rules: what it does, and nothing more (docs/security.md,
#: "Service identities"; the HTTP needs in "HTTP APIs"). Every service writes its spans
#: to %TRACE% through namesrv (FERRY_<SERVICE>_NAMESRV tracing): pub on it.
_TRACE = Rule("allow", "topic:%TRACE%", ("pub",))
SERVICES: dict[str, tuple[Rule, ...]] = {
    # one per broker container (svc-broker-a-0 ...): as a slave it links to its master
    # as its own broker id and no other (`broker:<name>/<id>` replicate)
    **{f"svc-{name}-{i}": (Rule("allow", f"broker:{name}/{i}", ("replicate",)), _TRACE)
       for name, i in (("broker-a", 0), ("broker-a", 1), ("broker-b", 0), ("broker-b", 1))},
    # pulls %SCHEDULE% as its group, re-sends due messages (DELIVER_DUE); asks namesrv
    # for the route of every topic it delivers to (admin read)
    "svc-delay-scheduler": (Rule("allow", "topic:%SCHEDULE%", ("sub",)),
                            Rule("allow", "group:ferry-delay-scheduler", ("consume",)),
                            Rule("allow", "admin", ("delay", "read")), _TRACE),
    # scans %HALF% / %OP% as its group, asks producers, commits or rolls back
    "svc-txn-checker": (Rule("allow", "topic:%HALF%", ("sub",)),
                        Rule("allow", "topic:%OP%", ("sub",)),
                        Rule("allow", "group:ferry-txn-checker", ("consume",)),
                        Rule("allow", "admin", ("txn",)), _TRACE),
    # reconciliation reads the topics it is asked about
    "svc-dedup": (Rule("allow", "admin", ("read",)), _TRACE),
    # the console's own identity only samples topic rates; users log in with their own
    "svc-console": (Rule("allow", "admin", ("read",)),),
    # the Spark report (spark/ferry_spark/jobs/report.py): lists topics and groups, reads
    # every topic's bounds and messages (%TRACE%, %RETRY%*, %DLQ%* included) and the groups'
    # committed offsets. admin read covers each of these and nothing more: a PULL needs
    # sub + consume or admin read, GET_MIN_MAX / OFFSET_FOR_TIME sub or admin read,
    # QUERY_OFFSET consume or admin read, namesrv's lists admin read. It sends nothing.
    "svc-spark": (Rule("allow", "admin", ("read",)),),
    # the Celery worker (deploy/celery_example.py): sends and takes tasks on its queues'
    # topics (user topics only: `topic:*` never matches an internal name), consumes as
    # the queues' groups `celery-<topic>` (their %RETRY% and %DLQ% topics with them),
    # and creates a queue's topic on first use (admin topics)
    "svc-celery-worker": (Rule("allow", "topic:*", ("pub", "sub")),
                          Rule("allow", "group:celery-*", ("consume",)),
                          Rule("allow", "admin", ("topics",)), _TRACE),
    # the metrics proxy (deploy/metrics_proxy.py) Prometheus scrapes through: every
    # service's GET /metrics is admin read (the console's: a login, any identity)
    "svc-metrics": (Rule("allow", "admin", ("read",)),),
}


#: The backing stores' passwords, and Grafana's admin password: the directory (volume)
#: each lives in.
REDIS, POSTGRES, GRAFANA = "redis", "postgres", "grafana"
#: Where dedup reaches them (the compose services' names; user and database `ferry`).
REDIS_URL = "redis://:{password}@redis:6379/0"
POSTGRES_URL = "postgresql://ferry:{password}@postgres:5432/ferry"


async def init(etcd: str, prefix: str, secrets_dir: Path) -> int:
    _backing_passwords(secrets_dir)
    registry = EtcdRegistry(etcd, prefix=prefix)
    await registry.start()
    try:
        auth = AuthRegistry(registry)
        existing = {u.access_key for u in await auth.list_users()}
        if existing:
            return await _check_existing(auth, existing, secrets_dir)
        admin = Credentials(ADMIN, os.environ.get("FERRY_ADMIN_SECRET") or generate_secret())
        _write(secrets_dir, admin)
        await auth.bootstrap_admin(ADMIN, admin.signing_key, admin_rules())
        for access_key in SERVICES:
            await _add_service(auth, secrets_dir, access_key)
        print(f"auth-init: created {ADMIN} and {', '.join(SERVICES)}; secrets in {secrets_dir}")
        return 0
    finally:
        await registry.stop()


async def _check_existing(auth: AuthRegistry, existing: set[str], secrets_dir: Path) -> int:
    """A later start: every identity's secret must be there; a service identity added
    since the first start (svc-spark) is created now, so an upgraded mesh gets it."""
    missing = [k for k in (ADMIN, *SERVICES) if (k == ADMIN or k in existing)
               and not _secret_file(secrets_dir, k).is_file()]
    if missing:
        print(f"auth-init: identities exist in etcd but the secrets of {missing} are "
              f"not in {secrets_dir}; remove those users (`ferry user remove`) or "
              "restore the volume", file=sys.stderr)
        return 1
    new = [k for k in SERVICES if k not in existing]
    for access_key in new:
        await _add_service(auth, secrets_dir, access_key)
    print(f"auth-init: identities exist; created {', '.join(new)}" if new
          else "auth-init: identities exist; nothing to do")
    return 0


async def _add_service(auth: AuthRegistry, secrets_dir: Path, access_key: str) -> None:
    creds = Credentials(access_key, generate_secret())
    _write(secrets_dir, creds)
    await auth.add_user(access_key, creds.signing_key, "compose service identity",
                        SERVICES[access_key])


def _secret_file(secrets_dir: Path, access_key: str) -> Path:
    """Where an identity's secret lives: a directory (a volume) of its own."""
    return secrets_dir / access_key / access_key


def _write(secrets_dir: Path, creds: Credentials) -> None:
    _write_file(_secret_file(secrets_dir, creds.access_key), creds.secret_key, 0o600)


def _write_file(path: Path, text: str, mode: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, mode)   # an existing file keeps its old mode through os.open


def _backing_passwords(secrets_dir: Path) -> None:
    """Redis's, PostgreSQL's and Grafana's admin passwords, generated on the first start
    and kept after (PostgreSQL and Grafana take theirs only when their data volume is
    new), and dedup's URLs.

    Their files are 0644: the redis, postgres and grafana images read them as their own
    users, and no other container mounts these volumes."""
    passwords = {}
    for name in (REDIS, POSTGRES, GRAFANA):
        path = secrets_dir / name / "password"
        if not path.is_file():
            _write_file(path, secrets.token_hex(24), 0o644)
        passwords[name] = path.read_text().strip()
    _write_file(secrets_dir / REDIS / "redis.conf",
                f"appendonly yes\nrequirepass {passwords[REDIS]}\n", 0o644)
    _write_file(secrets_dir / "svc-dedup" / "env",
                f"FERRY_DEDUP_REDIS={REDIS_URL.format(password=passwords[REDIS])}\n"
                f"FERRY_DEDUP_LEDGER_URL={POSTGRES_URL.format(password=passwords[POSTGRES])}\n",
                0o600)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--etcd", default="etcd:2379")
    p.add_argument("--etcd-prefix", default="/ferry/")
    p.add_argument("--secrets-dir", default="/run/ferry-auth", type=Path)
    args = p.parse_args(argv)
    return asyncio.run(init(args.etcd, args.etcd_prefix, args.secrets_dir))


if __name__ == "__main__":
    sys.exit(main())

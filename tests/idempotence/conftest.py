"""Fixtures for ferry.idempotence: a RedisClaim on the session Redis under a prefix of its own,
and a real throwaway PostgreSQL for the ledger with one fresh database per test.

The PostgreSQL cluster is initdb'ed in a temp dir and run on a free port once
per session (`tests.support.procs.start_postgres`).
"""
from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import psycopg
import pytest
from ferry.client.core.message import ConsumerRecord
from ferry.idempotence import RedisClaim

from tests.support.procs import Postgres, Redis, start_postgres


@dataclass(frozen=True)
class FakeRecord:
    """The two fields a claim reads from a consumed message."""

    msg_id: str
    key: str | None = None


def record(key: str | None = None, msg_id: str | None = None) -> ConsumerRecord:
    """A stand-in for a consumed message (key and message id only)."""
    return cast(ConsumerRecord, FakeRecord(msg_id or uuid.uuid4().hex.upper(), key))


def unique_prefix() -> str:
    """A claim key prefix no other test uses, so tests share the session Redis safely."""
    return f"ferry:idem-test-{uuid.uuid4().hex[:8]}"


@pytest.fixture
async def claim(redis_server: Redis) -> AsyncIterator[RedisClaim]:
    async with RedisClaim(redis_server.url, lease_ms=5_000, key_prefix=unique_prefix()) as c:
        yield c


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Postgres]:
    server = start_postgres(Path(tmp_path_factory.mktemp("postgres")))
    yield server
    server.proc.stop()


@pytest.fixture
def pg_database(postgres: Postgres) -> Iterator[str]:
    """The name of a fresh, empty database on the session's cluster."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(postgres.dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    yield name
    with psycopg.connect(postgres.dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

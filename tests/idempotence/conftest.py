"""Fixtures for the idempotence tests: a real throwaway PostgreSQL and one database per test.

The cluster is initdb'ed in a temp dir and run on a free port once per session
(`tests.support.procs.start_postgres`); each test that needs PostgreSQL gets
a fresh database in it, dropped afterwards.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.support.procs import Postgres, start_postgres


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

"""`python -m ferry.idempotence`: creating the schema by a command, and look-ups, on SQLite
and a real throwaway PostgreSQL (run as a real subprocess)."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from ferry.idempotence import Ledger

from tests.idempotence.backends import pg_conninfo
from tests.idempotence.test_ledger import Msg
from tests.support.procs import Postgres

pytestmark = pytest.mark.integration


def command(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ferry.idempotence", *args],
                          capture_output=True, text=True, timeout=60, env=dict(os.environ),
                          check=False)


def test_create_schema_and_lookups_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'app.db'}"
    for _ in range(2):   # idempotent
        done = command("create-schema", url)
        assert done.returncode == 0, done.stderr
    conn = sqlite3.connect(tmp_path / "app.db")
    with conn:
        Ledger().record(conn, scene="billing", record=Msg("AA" * 16, key="o-1"), amount=5)
    conn.close()
    found = command("lookup", url, "--scene", "billing", "--biz-key", "o-1")
    assert found.returncode == 0, found.stderr
    row = json.loads(found.stdout)
    assert (row["msg_id"], row["amount"], row["queue_offset"]) == ("AA" * 16, 5, 7)
    assert command("lookup", url, "--msg-id", "BB" * 16).returncode == 1
    assert command("lookup", url).returncode == 2
    assert command("create-schema", "mysql://x/y").returncode == 2


def test_create_schema_on_postgres(postgres: Postgres, pg_database: str) -> None:
    url = pg_conninfo(postgres, pg_database)
    done = command("create-schema", url, "--table", "billing_ledger")
    assert done.returncode == 0, done.stderr
    with psycopg.connect(url) as conn:
        names = {r[0] for r in conn.execute(
            "SELECT indexname FROM pg_indexes WHERE tablename = 'billing_ledger'")}
    assert names == {"billing_ledger_scene_biz_key", "billing_ledger_msg_id",
                     "billing_ledger_topic_time"}
    assert command("lookup", url, "--table", "billing_ledger", "--msg-id", "CC" * 16
                   ).returncode == 1

"""deploy/docker-compose.yml stays a valid Compose file describing the whole mesh.

There is no Docker engine here, but `docker-compose config` (installed by
`make setup`) parses and validates the file as Compose would before running it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml"


def compose(*args: str) -> str:
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_compose_file_is_valid_and_runs_every_service() -> None:
    services = set(compose("config", "--services").split())
    assert services == {"etcd", "redis", "namesrv", "broker-a", "broker-b", "delay-scheduler",
                        "txn-checker"}


def test_ferry_services_reach_etcd_and_namesrv_by_service_name() -> None:
    resolved = compose("config")  # with the YAML anchors and merges applied
    assert resolved.count("FERRY_BROKER_ETCD: etcd:2379") == 2
    assert "FERRY_BROKER_NAME: broker-b" in resolved
    assert "FERRY_DELAY_SCHEDULER_NAMESRV: namesrv:9876" in resolved
    assert "FERRY_TXN_CHECKER_NAMESRV: namesrv:9876" in resolved

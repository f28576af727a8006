"""A real Prometheus scrapes every service of `make up`'s mesh (docs/metrics.md).

The mesh is deploy/local_mesh.py on free ports (test_newcomer's fixture); the
targets are the /metrics URLs its banner prints. After `ferry send` and
`ferry consume` of known counts, PromQL over Prometheus's HTTP API gives those
counts, and the lag of the group once it has stopped and more was sent.
"""
from __future__ import annotations

import json
import re
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.test_newcomer import ferry, mesh  # noqa: F401 - the module's mesh fixture
from tests.support.prometheus import Prometheus, start_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SERVICES = ["broker-a", "broker-b", "console", "dedup", "namesrv", "scheduler", "txn-checker"]
TOPIC, GROUP = "metered", "watched"
SENT_FIRST, SENT_LATER = 12, 5


def banner_targets(env: dict[str, str]) -> dict[str, str]:
    """The /metrics URLs the banner of `make up` prints, by service."""
    text = (Path(env["FERRY_MESH_VAR_DIR"]).parent / "mesh.out").read_text()
    return dict(re.findall(r"^  (\S+)\s+(http://127\.0\.0\.1:\d+/metrics)$", text, re.M))


def wait_every_service_scraped(prom: Prometheus) -> None:
    """Until every service has answered a scrape (`up` is 1 for its job)."""
    for job in SERVICES:
        assert prom.wait_value(f'up{{job="{job}"}}', 1) == 1, job


def test_prometheus_counts_what_was_sent_and_consumed(mesh: dict[str, str],  # noqa: F811
                                                      tmp_path: Path) -> None:
    targets = banner_targets(mesh)
    assert sorted(targets) == SERVICES
    prom = start_prometheus(tmp_path / "prometheus", targets)
    try:
        wait_every_service_scraped(prom)
        ferry(mesh, "topic", "create", TOPIC)
        ferry(mesh, "send", TOPIC, "hello", "--count", str(SENT_FIRST))
        ferry(mesh, "consume", TOPIC, "--group", GROUP, "--from", "earliest",
              "--count", str(SENT_FIRST), "--timeout-ms", "30000")
        topic = f'messaging_destination_name="{TOPIC}"'
        group = f'messaging_consumer_group_name="{GROUP}",{topic}'
        stored = f"sum(ferry_broker_topic_messages_total{{{topic}}})"
        committed = f"sum(ferry_broker_group_committed_total{{{group}}})"
        lag = f"sum(ferry_broker_group_lag{{{group}}})"
        assert prom.wait_value(stored, SENT_FIRST) == SENT_FIRST
        assert prom.wait_value(committed, SENT_FIRST) == SENT_FIRST
        assert prom.wait_value(lag, 0) == 0
        # The group's consumer has exited: what is sent now waits, and the lag says so.
        ferry(mesh, "send", TOPIC, "later", "--count", str(SENT_LATER))
        assert prom.wait_value(stored, SENT_FIRST + SENT_LATER) == SENT_FIRST + SENT_LATER
        assert prom.wait_value(lag, SENT_LATER) == SENT_LATER
        assert prom.value(committed) == SENT_FIRST
        # The brokers' store and the services' kit metrics are there too.
        assert prom.value('count(ferry_broker_store_size_bytes > 0)') == 2
        assert prom.value('count(count by (job) (target_info))') == len(SERVICES)
        assert prom.wait_value("ferry_namesrv_brokers", 2) == 2
    finally:
        prom.proc.stop()


def test_the_other_services_count_what_they_did(mesh: dict[str, str],  # noqa: F811
                                                tmp_path: Path) -> None:
    """A delayed message: the scheduler's lateness histogram counts it; two claims of one key
    at dedup: one claimed, one processing; the txn-checker and console series exist."""
    prom = start_prometheus(tmp_path / "prometheus", banner_targets(mesh))
    try:
        wait_every_service_scraped(prom)
        ferry(mesh, "topic", "create", "delayed-metered")
        ferry(mesh, "send", "delayed-metered", "soon", "--delay-ms", "1000")
        ferry(mesh, "consume", "delayed-metered", "--group", "d", "--from", "earliest",
              "--count", "1", "--timeout-ms", "30000")
        assert prom.wait_value("sum(ferry_scheduler_delivered_total)", 1) == 1
        assert prom.wait_value("sum(ferry_scheduler_lateness_seconds_count)", 1) == 1
        assert prom.value("sum(ferry_scheduler_pending)") == 0
        url = f"http://127.0.0.1:{mesh['FERRY_MESH_DEDUP_PORT']}/v1/claims"
        for _ in range(2):
            body = json.dumps({"scene": "metered", "biz_key": "k1"}).encode()
            request = urllib.request.Request(url, body, {"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=5).close()
        for outcome in ("claimed", "processing"):
            assert prom.wait_value(f'ferry_dedup_claims_total{{outcome="{outcome}"}}', 1) == 1
        assert prom.value("ferry_txn_checker_open") == 0
        assert prom.value('ferry_txn_checker_events_total{event="checked"}') == 0
        assert prom.value("ferry_console_sessions") == 0
    finally:
        prom.proc.stop()

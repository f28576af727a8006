"""A real Prometheus scrapes every service of `make up`'s mesh (docs/metrics.md).

The mesh is deploy/local_mesh.py on free ports (test_newcomer's fixture); the
targets are the /metrics URLs its banner prints. After `ferry send` and
`ferry consume` of known counts, PromQL over Prometheus's HTTP API gives those
counts, and the lag of the group once it has stopped and more was sent. The
Grafana dashboard of deploy/ queries only metrics the mesh exports, and each of its
queries is valid PromQL that gives series.
"""
from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.test_newcomer import FERRY, ferry, mesh  # noqa: F401 - the module's mesh fixture
from tests.support.prometheus import Prometheus, start_prometheus
from tests.support.promql import dashboard_queries, for_prometheus, metric_names

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


ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "ferry.json"
#: Metrics the dashboard shows that a `make up` mesh does not export (auth off, one broker
#: per group): each with where the code names it (OpenTelemetry's dotted name).
ONLY_ELSEWHERE = {
    "ferry_broker_replication_lag_bytes": ("services/broker/ferry_broker/metrics.py",
                                           '"ferry.broker.replication.lag"'),
    "ferry_auth_refused_total": ("libs/ferry/ferry/service/http.py", '"ferry.auth.refused"'),
}


def exported_names(prom: Prometheus) -> set[str]:
    """Every metric name Prometheus has scraped (its `__name__` values)."""
    with urllib.request.urlopen(f"{prom.url}/api/v1/label/__name__/values", timeout=5) as r:
        body = json.load(r)
    assert body["status"] == "success", body
    return set(body["data"])


def test_the_dashboard_queries_only_metrics_the_mesh_exports(mesh: dict[str, str],  # noqa: F811
                                                             tmp_path: Path) -> None:
    """deploy/grafana/dashboards/ferry.json: after traffic of every kind the panels show
    (sent, consumed, a delayed message, a live consumer), every metric name of every
    query and variable is one Prometheus scraped from the mesh (or one of ONLY_ELSEWHERE,
    whose name the code holds), and every query, run against the real Prometheus, parses
    and gives series (or none, for those absent metrics)."""
    prom = start_prometheus(tmp_path / "prometheus", banner_targets(mesh))
    try:
        wait_every_service_scraped(prom)
        for args in (("topic", "create", "dashboard"), ("send", "dashboard", "x", "--count", "3"),
                     ("consume", "dashboard", "--group", "dash", "--from", "earliest",
                      "--count", "3", "--timeout-ms", "30000"),
                     ("send", "dashboard", "later", "--delay-ms", "500"),
                     ("consume", "dashboard", "--group", "dash", "--count", "1",
                      "--timeout-ms", "30000")):
            ferry(mesh, *args)
        assert (prom.wait_value("sum(ferry_scheduler_lateness_seconds_count)", 1) or 0) >= 1
        assert prom.wait_value('sum(ferry_broker_group_committed_total{'
                               'messaging_consumer_group_name="dash"})', 4) == 4
        # dedup: a claim confirmed and one released (their counters start at the first)
        for key, end in (("d1", "confirm"), ("d2", "release")):
            claim = dedup_post(mesh, "/v1/claims", {"scene": "dash", "biz_key": key})
            dedup_post(mesh, f"/v1/claims/{end}",
                       {"scene": "dash", "biz_key": key, "token": claim["token"]})
        assert prom.wait_value('ferry_dedup_releases_total{outcome="ok"}', 1) == 1
        # a consumer that stays (the live-consumers panel shows only live ones)
        live = subprocess.Popen([FERRY, "consume", "dashboard", "--group", "dash-live",
                                 "--count", "1000", "--timeout-ms", "120000"], env=mesh,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            assert prom.wait_value('max(ferry_broker_consumers{'
                                   'messaging_consumer_group_name="dash-live"})', 1) == 1
            check_dashboard(prom)
        finally:
            live.kill()
            live.wait()
    finally:
        prom.proc.stop()


def dedup_post(env: dict[str, str], path: str, body: dict[str, str]) -> dict[str, str]:
    url = f"http://127.0.0.1:{env['FERRY_MESH_DEDUP_PORT']}{path}"
    request = urllib.request.Request(url, json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=5) as resp:
        return dict(json.load(resp))


def check_dashboard(prom: Prometheus) -> None:
    exported = exported_names(prom)
    for name, (path, dotted) in ONLY_ELSEWHERE.items():
        assert name not in exported, f"{name} is exported now: drop it from ONLY_ELSEWHERE"
        assert dotted in (ROOT / path).read_text(), name
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    assert len(queries) >= 30, "every panel's and variable's query"
    for where, expr in queries:
        names = metric_names(expr)
        assert names, (where, expr)
        unknown = names - exported - set(ONLY_ELSEWHERE)
        assert not unknown, f"{where}: {expr} uses {sorted(unknown)}, not exported"
        result = prom.query(for_prometheus(expr))  # asserts status success
        if names - set(ONLY_ELSEWHERE):
            assert result, f"{where}: {expr} gives no series"


def test_make_up_runs_a_prometheus_that_scrapes_every_service(mesh: dict[str, str]) -> None:  # noqa: F811
    """`make up PROMETHEUS=1` (the fixture runs `local_mesh.py up --prometheus`): the banner
    says where its Prometheus is, and it scrapes every /metrics the banner lists."""
    text = (Path(mesh["FERRY_MESH_VAR_DIR"]).parent / "mesh.out").read_text()
    port = int(re.findall(r"^Prometheus: http://127\.0\.0\.1:(\d+) ", text, re.M)[0])
    assert port == int(mesh["FERRY_MESH_PROMETHEUS_PORT"])
    prom = Prometheus(None, port)
    for job in SERVICES:
        assert prom.wait_value(f'up{{job="{job}"}}', 1) == 1, job
    assert prom.value("count(up)") == len(SERVICES)
    assert prom.wait_value("ferry_namesrv_brokers", 2) == 2

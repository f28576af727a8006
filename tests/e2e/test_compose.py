"""deploy/docker-compose.yml stays a valid Compose file describing the whole mesh.

There is no Docker engine here, but `docker-compose config` (installed by
`make setup`) parses and validates the file as Compose would before running it.
"""
from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "deploy" / "docker-compose.yml"


def compose(*args: str) -> str:
    done = subprocess.run(["docker-compose", "-f", str(COMPOSE), *args], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_compose_file_is_valid_and_runs_every_service() -> None:
    services = set(compose("config", "--services").split())
    assert services == {"etcd", "redis", "namesrv", "broker-a", "broker-a-1", "broker-b",
                        "broker-b-1", "delay-scheduler", "delay-scheduler-1", "txn-checker",
                        "txn-checker-1", "postgres", "dedup",
                        "jaeger", "console", "auth-init", "spark", "worker",
                        "metrics-proxy", "prometheus", "grafana"}


def test_ferry_services_reach_etcd_and_namesrv_by_service_name() -> None:
    resolved = compose("config")  # with the YAML anchors and merges applied
    assert resolved.count("FERRY_BROKER_ETCD: etcd:2379") == 4
    assert resolved.count("FERRY_BROKER_NAME: broker-b") == 2
    assert "FERRY_DELAY_SCHEDULER_NAMESRV: namesrv:9876" in resolved
    assert "FERRY_TXN_CHECKER_NAMESRV: namesrv:9876" in resolved
    assert "FERRY_DEDUP_NAMESRV: namesrv:9876" in resolved
    assert "FERRY_CONSOLE_NAMESRV: namesrv:9876" in resolved


def test_dedup_keeps_its_ledger_on_the_postgres_service() -> None:
    """Its Redis and ledger URLs carry generated passwords: auth-init writes them to dedup's
    own secret volume (tests/auth/test_compose_identities.py), never to this file."""
    resolved = compose("config")
    assert "FERRY_DEDUP_LEDGER_URL" not in resolved and "FERRY_DEDUP_REDIS" not in resolved
    assert "secret-svc-dedup:/run/ferry-auth:ro" in resolved
    auth_init = (COMPOSE.parent / "auth_init.py").read_text()
    assert '"postgresql://ferry:{password}@postgres:5432/ferry"' in auth_init
    assert '"redis://:{password}@redis:6379/0"' in auth_init
    assert "FERRY_DEDUP_HTTP_PORT: '10926'" in resolved or \
        'FERRY_DEDUP_HTTP_PORT: "10926"' in resolved


def test_the_brokers_form_two_replicated_groups_of_two() -> None:
    """The HA topology: each broker name has ids 0 and 1, sync replication, distinct volumes."""
    resolved = compose("config")
    assert resolved.count("FERRY_BROKER_ID: '0'") + resolved.count('FERRY_BROKER_ID: "0"') == 2
    assert resolved.count("FERRY_BROKER_ID: '1'") + resolved.count('FERRY_BROKER_ID: "1"') == 2
    assert resolved.count("FERRY_BROKER_REPLICATION: sync") == 4
    # acknowledged once both brokers of the group have it (issue 24)
    assert resolved.count("FERRY_BROKER_MIN_INSYNC_REPLICAS: '2'") + \
        resolved.count('FERRY_BROKER_MIN_INSYNC_REPLICAS: "2"') == 4
    for host in ("broker-a", "broker-a-1", "broker-b", "broker-b-1"):
        assert f"FERRY_BROKER_ADVERTISE_HOST: {host}\n" in resolved
        assert f"source: {host}-data" in resolved or f"{host}-data:/data" in resolved


def test_every_ferry_service_exports_spans_to_jaeger() -> None:
    """OTLP/HTTP to the jaeger service from each of the 10 Ferry processes (two schedulers,
    two checkers) and the Celery worker; the brokers also know namesrv, through which they
    write the %TRACE% topic."""
    resolved = compose("config")
    assert resolved.count("OTEL_EXPORTER_OTLP_ENDPOINT: http://jaeger:4318") == 11
    assert resolved.count("FERRY_BROKER_NAMESRV: namesrv:9876") == 4
    assert "jaegertracing/all-in-one" in resolved
    assert "COLLECTOR_OTLP_ENABLED" in resolved


def test_auth_is_on_and_every_ferry_service_runs_under_its_own_identity() -> None:
    """FERRY_AUTH=on in the 11 Ferry processes (namesrv, 4 brokers, 2 schedulers, 2 checkers,
    dedup, console) and the Celery worker; all but namesrv start through with-identity.sh
    with their own access key, whose secret auth-init wrote to that identity's own volume,
    and so do the Spark report (a client: svc-spark), the worker (svc-celery-worker, also
    in its healthcheck) and the metrics proxy (svc-metrics); etcd is not published."""
    resolved = compose("config")
    assert resolved.count('FERRY_AUTH: "on"') + resolved.count("FERRY_AUTH: 'on'") == 12
    assert resolved.count("- svc-broker") == 4
    for key, instances in (("svc-delay-scheduler", 2), ("svc-txn-checker", 2), ("svc-dedup", 1),
                           ("svc-console", 1), ("svc-spark", 1), ("svc-celery-worker", 2),
                           ("svc-metrics", 1)):
        assert resolved.count(f"- {key}\n") == instances, key
    assert resolved.count("/opt/ferry/deploy/with-identity.sh") == 14
    assert "/opt/ferry/deploy/auth_init.py" in resolved
    assert "2379:2379" not in resolved


def test_the_spark_service_reports_on_the_mesh_into_a_volume() -> None:
    """The Spark report (docs/spark.md) runs in its own image with a JRE, against namesrv."""
    resolved = compose("config")
    spark = resolved[resolved.index("\n  spark:"):]
    spark = spark[:spark.index("\n  txn-checker:")] if "\n  txn-checker:" in spark else spark
    assert "dockerfile: deploy/Dockerfile.spark" in spark
    assert "FERRY_NAMESRV: namesrv:9876" in spark
    assert "spark/jobs/report.py" in spark and "/out" in spark and "spark-out" in spark
    dockerfile = (COMPOSE.parent / "Dockerfile.spark").read_text()
    assert "openjdk-17-jre-headless" in dockerfile and "./spark" in dockerfile


def _resolved_services() -> dict[str, Any]:
    """The services as Compose runs them: `config` with anchors and merges applied."""
    return dict(yaml.safe_load(compose("config"))["services"])


FERRY_HTTP_PORTS = {"namesrv": 9876, "broker-a": 10920, "broker-a-1": 10920, "broker-b": 10920,
                    "broker-b-1": 10920, "delay-scheduler": 10922, "delay-scheduler-1": 10922,
                    "txn-checker": 10923, "txn-checker-1": 10923,
                    "dedup": 10926, "console": 10927}


def test_every_service_has_a_healthcheck_after_merging() -> None:
    """The YAML merges once dropped the brokers' healthcheck: each service has its own,
    with a test and a timing; the Ferry services probe their own /readyz with python."""
    services = _resolved_services()
    for name, svc in services.items():
        check = svc.get("healthcheck")
        assert check and not check.get("disable"), f"{name} has no healthcheck"
        test = check["test"]
        assert test[0] in ("CMD", "CMD-SHELL") and len(test) > 1, name
        assert check["interval"] and check["timeout"] and check["retries"] >= 1, name
    for name, port in FERRY_HTTP_PORTS.items():
        test = services[name]["healthcheck"]["test"]
        assert test[:3] == ["CMD", "python", "-c"], name
        assert f"http://127.0.0.1:{port}/readyz" in test[3], name


def _after(services: dict[str, Any], name: str) -> dict[str, str]:
    """What `name` waits for at start, and for which condition."""
    deps = services[name].get("depends_on") or {}
    return {dep: spec["condition"] for dep, spec in deps.items()}


def test_services_start_in_order_once_what_they_need_is_healthy() -> None:
    """etcd, then auth-init (completed), namesrv, the four brokers, then the services that
    use brokers; dedup also after redis and postgres. Every service waited for has a
    healthcheck (or, auth-init, runs to completion)."""
    services = _resolved_services()
    healthy = "service_healthy"
    brokers = ("broker-a", "broker-a-1", "broker-b", "broker-b-1")
    assert _after(services, "auth-init") == {"etcd": healthy}
    assert _after(services, "namesrv") == {"etcd": healthy,
                                           "auth-init": "service_completed_successfully"}
    for broker in brokers:
        assert _after(services, broker) == {"etcd": healthy, "namesrv": healthy,
                                            "auth-init": "service_completed_successfully"}
    for name in ("delay-scheduler", "delay-scheduler-1", "txn-checker", "txn-checker-1",
                 "dedup", "console", "spark"):
        after = _after(services, name)
        assert {b: after.get(b) for b in (*brokers, "namesrv", "etcd")} == \
            dict.fromkeys((*brokers, "namesrv", "etcd"), healthy), name
    assert _after(services, "dedup")["redis"] == healthy
    assert _after(services, "dedup")["postgres"] == healthy
    for name in services:
        for dep, condition in _after(services, name).items():
            assert condition != healthy or services[dep].get("healthcheck"), (name, dep)


def test_a_celery_worker_runs_the_example_app_on_the_ferry_image() -> None:
    """The `worker` service: a Celery worker against `ferry://namesrv:9876` running the
    example app the image ships, on the image that has the `celery` extra."""
    services = _resolved_services()
    worker = services["worker"]
    assert worker["image"] == "ferry:dev" and worker["build"]["dockerfile"] == "deploy/Dockerfile"
    command = worker["command"]
    assert command[2:] == ["celery", "--workdir", "/opt/ferry/deploy", "-A", "celery_example",
                           "worker", "--loglevel", "INFO", "--concurrency", "2"]
    assert worker["environment"]["CELERY_BROKER_URL"] == "ferry://namesrv:9876"
    dockerfile = (COMPOSE.parent / "Dockerfile").read_text()
    assert '"./libs/ferry[postgres,celery]"' in dockerfile
    assert "deploy/celery_example.py" in dockerfile and (COMPOSE.parent / "celery_example.py").is_file()


def test_prometheus_and_grafana_run_beside_the_mesh() -> None:
    """Prometheus scrapes through metrics-proxy (neither published); Grafana, published for
    operators, starts once Prometheus is healthy."""
    services = _resolved_services()
    assert services["prometheus"]["image"].startswith("prom/prometheus:")
    assert services["grafana"]["image"].startswith("grafana/grafana:")
    assert not services["prometheus"].get("ports") and not services["metrics-proxy"].get("ports")
    assert [p["target"] for p in services["grafana"]["ports"]] == [3000]
    assert _after(services, "grafana")["prometheus"] == "service_healthy"
    assert _after(services, "prometheus") == {"metrics-proxy": "service_healthy"}
    assert _after(services, "metrics-proxy") == {
        "auth-init": "service_completed_successfully"}

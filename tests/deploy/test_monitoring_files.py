"""deploy/'s monitoring files hold together: Prometheus's config is valid (`promtool`) and
scrapes every Ferry service of the compose file through the metrics proxy, whose allowed
targets are the same; Grafana's provisioning finds the datasource and the dashboard where
the compose file mounts them.

The dashboard's queries are checked against a running mesh and a real Prometheus in
tests/e2e/test_mesh_metrics.py.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.promql import for_prometheus, metric_names

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
PROMETHEUS_YML = DEPLOY / "prometheus" / "prometheus.yml"
GRAFANA = DEPLOY / "grafana"
PROXY = "metrics-proxy:9100"
#: How a Ferry service's healthcheck probes its own HTTP port.
_READYZ = re.compile(r"http://127\.0\.0\.1:(\d+)/readyz")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("promtool")
    if binary is None:
        pytest.fail("no promtool: `make setup` installs Debian's prometheus package")
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60)


def compose_services() -> dict[str, Any]:
    done = subprocess.run(["docker-compose", "-f", str(DEPLOY / "docker-compose.yml"), "config"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return dict(yaml.safe_load(done.stdout)["services"])


def scrape_jobs() -> list[dict[str, Any]]:
    return list(yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"])


def test_promtool_accepts_the_config_and_refuses_a_broken_one(tmp_path: Path) -> None:
    done = promtool("check", "config", str(PROMETHEUS_YML))
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / "prometheus.yml"
    broken.write_text(PROMETHEUS_YML.read_text().replace("scrape_interval: 15s",
                                                         "scrape_interval: often"))
    refused = promtool("check", "config", str(broken))
    assert refused.returncode != 0 and "often" in refused.stdout + refused.stderr


def test_every_ferry_service_of_the_compose_file_is_scraped_through_the_proxy() -> None:
    """The Ferry services are those whose healthcheck probes their own /readyz: each is a
    target (service:port), every job relabels its targets to the proxy's address (the
    service kept as `instance`), and the proxy allows exactly these targets."""
    services = compose_services()
    ferry = {f"{name}:{_READYZ.search(' '.join(svc['healthcheck']['test'])).group(1)}"
             for name, svc in services.items()
             if _READYZ.search(" ".join(svc["healthcheck"]["test"]))}
    assert len(ferry) == 11, ferry   # namesrv, 4 brokers, 2 schedulers, 2 checkers, dedup, console
    targets: set[str] = set()
    for job in scrape_jobs():
        for static in job["static_configs"]:
            targets.update(static["targets"])
        relabel = job["relabel_configs"]
        assert {"source_labels": ["__address__"], "target_label": "__param_target"} in relabel
        assert {"source_labels": ["__param_target"], "target_label": "instance"} in relabel
        assert {"target_label": "__address__", "replacement": PROXY} in relabel, job["job_name"]
    assert targets == ferry
    command = services["metrics-proxy"]["command"]
    allowed = {t for flag in ("--targets", "--console")
               for t in command[command.index(flag) + 1].split(",")}
    assert allowed == ferry
    assert command[command.index("--console") + 1] == "console:10927"
    assert command[:2] == ["/opt/ferry/deploy/with-identity.sh", "svc-metrics"]


def _mount(volume: str | dict[str, Any]) -> tuple[str, tuple[Path | str, str]]:
    """target -> (source, mode) of a resolved volume (docker-compose 1.x: `src:dst:mode`)."""
    if isinstance(volume, dict):
        return volume["target"], (Path(volume["source"]) if volume["type"] == "bind"
                                  else volume["source"], "ro" if volume.get("read_only") else "rw")
    source, target, mode = volume.split(":")
    return target, (Path(source) if source.startswith("/") else source, mode)


def test_prometheus_and_grafana_mount_the_shipped_files() -> None:
    services = compose_services()
    mounts = {name: dict(_mount(v) for v in services[name]["volumes"])
              for name in ("prometheus", "grafana")}
    assert mounts["prometheus"]["/etc/prometheus/prometheus.yml"] == (PROMETHEUS_YML, "ro")
    assert "--config.file=/etc/prometheus/prometheus.yml" in services["prometheus"]["command"]
    assert mounts["grafana"]["/etc/grafana/provisioning"] == (GRAFANA / "provisioning", "ro")
    assert mounts["grafana"]["/etc/grafana/dashboards"] == (GRAFANA / "dashboards", "ro")
    # Prometheus reaches only the proxy; Grafana reaches Prometheus (the `metrics` network)
    assert set(services["prometheus"]["networks"]) == {"metrics"}
    assert set(services["grafana"]["networks"]) == {"metrics"}
    assert set(services["metrics-proxy"]["networks"]) == {"default", "metrics"}


def test_grafana_provisioning_finds_the_datasource_and_the_dashboard() -> None:
    datasources = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = datasources["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/ferry.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["options"]["path"] == "/etc/grafana/dashboards"
    dashboard = json.loads((GRAFANA / "dashboards" / "ferry.json").read_text())
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows[:5] == ["Overview", "Topic", "Group", "Broker", "Scheduler"]
    for panel in dashboard["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == source["uid"], panel["title"]
            assert panel["targets"], panel["title"]
            assert all(t["datasource"]["uid"] == source["uid"] for t in panel["targets"])
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    taken: dict[tuple[int, int], str] = {}   # grid cells: no panel covers another
    for panel in dashboard["panels"]:
        g = panel["gridPos"]
        assert g["x"] + g["w"] <= 24, panel["title"]
        for cell in ((x, y) for x in range(g["x"], g["x"] + g["w"])
                     for y in range(g["y"], g["y"] + g["h"])):
            assert cell not in taken, (panel["title"], taken[cell])
            taken[cell] = panel["title"]


def test_metric_names_are_found_in_promql() -> None:
    """The names the dashboard check relies on: functions, aggregations, grouping labels,
    matchers, ranges, keywords and numbers are not metric names."""
    expr = ('histogram_quantile(0.99, sum by (le) (rate(a_bucket{x=~"$topic",y="b c"}[5m])))'
            ' / on (instance) group_left (role) b_total unless c offset 5m or vector(0)')
    assert metric_names(expr) == {"a_bucket", "b_total", "c"}
    assert metric_names('label_values(d{topic=~"$topic"}, group)') == {"d"}
    assert for_prometheus('label_values(d{t=~"$topic"}, g)') == 'count by (g) (d{t=~".*"})'
    assert for_prometheus("rate(x[$__rate_interval])") == "rate(x[1m])"

"""A Prometheus for the `make up` mesh (`make up PROMETHEUS=1`): Debian's `prometheus`
scraping every service's `GET /metrics` that the banner lists.

Its config is generated into var/prometheus/prometheus.yml (one job per component,
every 5 s; the targets are the mesh's own ports, so FERRY_MESH_<NAME>_PORT moves them
too), its data goes to var/prometheus/data, and it listens on 127.0.0.1 only
(FERRY_MESH_PROMETHEUS_PORT, default 9090). The mesh runs with auth off, so it scrapes
the services directly, without deploy/metrics_proxy.py. Grafana is not started: the
dashboard deploy/grafana/dashboards/ferry.json can be imported into one of your own
(docs/metrics.md).
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from urllib.parse import urlsplit

PROMETHEUS_PORT = int(os.environ.get("FERRY_MESH_PROMETHEUS_PORT", 9090))
SCRAPE_INTERVAL = "5s"


def config_text(metrics_urls: dict[str, str]) -> str:
    """prometheus.yml (as JSON, which is YAML too) with one job per component."""
    jobs = [{"job_name": name, "metrics_path": urlsplit(url).path,
             "static_configs": [{"targets": [urlsplit(url).netloc]}]}
            for name, url in metrics_urls.items()]
    return json.dumps({"global": {"scrape_interval": SCRAPE_INTERVAL,
                                  "evaluation_interval": SCRAPE_INTERVAL},
                       "scrape_configs": jobs}, indent=2) + "\n"


def prometheus_argv(metrics_urls: dict[str, str], var: Path) -> list[str]:
    """Write the config under `var`/prometheus and return the command that runs it."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise SystemExit("PROMETHEUS=1 needs the `prometheus` command: `make setup` installs "
                         "Debian's package")
    workdir = var / "prometheus"
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "prometheus.yml"
    config.write_text(config_text(metrics_urls))
    return [binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{PROMETHEUS_PORT}", "--log.level=warn"]

"""A real Prometheus server (Debian's `prometheus`) scraping given targets, and PromQL over
its HTTP API.

`start_prometheus(workdir, {"broker-a": "http://127.0.0.1:10920/metrics", ...})` writes a
scrape config with one job per target (scraped every second) and waits until the server
is ready; `query(expr)` answers the value of an instant query.
"""
from __future__ import annotations

import json
import shutil
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.support.procs import Proc, free_port, spawn, wait_until_ready


@dataclass
class Prometheus:
    proc: Proc | None   # None: a server the test did not start (`make up`'s)
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def query(self, expr: str) -> list[dict]:
        """The result vector of the instant query `expr` (each: `metric` labels, `value`)."""
        url = f"{self.url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float | None:
        """The single value `expr` gives now (None: no series)."""
        result = self.query(expr)
        assert len(result) <= 1, result
        return float(result[0]["value"][1]) if result else None

    def wait_value(self, expr: str, expected: float, timeout_s: float = 30.0) -> float | None:
        """Wait until `expr` gives `expected` (a few scrapes); the last value seen."""
        deadline = time.monotonic() + timeout_s
        got = self.value(expr)
        while got != expected and time.monotonic() < deadline:
            time.sleep(0.5)
            got = self.value(expr)
        return got


def scrape_config(targets: dict[str, str]) -> str:
    """A prometheus.yml scraping each target (job = its name) every second."""
    jobs = []
    for job, url in targets.items():
        parts = urllib.parse.urlsplit(url)
        jobs.append(f"  - job_name: {json.dumps(job)}\n"
                    f"    scheme: {parts.scheme}\n"
                    f"    metrics_path: {json.dumps(parts.path)}\n"
                    f"    static_configs:\n      - targets: [{json.dumps(parts.netloc)}]\n")
    return ("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n"
            "  evaluation_interval: 1s\nscrape_configs:\n" + "".join(jobs))


def start_prometheus(workdir: Path, targets: dict[str, str], *,
                     config: str | None = None) -> Prometheus:
    """Run Debian's prometheus on a free port scraping `targets` (or with the whole
    prometheus.yml `config` given); stop it with `.proc.stop()`."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError("no prometheus binary: `make setup` installs Debian's package")
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus.yml"
    path.write_text(scrape_config(targets) if config is None else config)
    port = free_port()
    proc = spawn("prometheus", [binary, f"--config.file={path}",
                                f"--storage.tsdb.path={workdir / 'data'}",
                                f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                 workdir)
    wait_until_ready(proc, f"http://127.0.0.1:{port}/-/ready", timeout_s=30)
    return Prometheus(proc, port)

"""CPU one Prometheus scrape costs each service of a running mesh (`mesh.metrics_cost`).

A throughput comparison of metrics on and off moves by more than the cost it
looks for on a shared 2-core machine, so the bench also measures the cost
itself: each service's CPU time (utime + stime of its process, /proc) across
SCRAPES back-to-back GETs of its /metrics, per scrape. Metrics cost nothing
on the put and pull paths (every instrument is read at scrape time), so this
is what metrics on adds: at Prometheus's interval, per second, per core.
"""
from __future__ import annotations

import os
import re
import subprocess
import urllib.request

SCRAPES = 50
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _pid_listening(port: int) -> int | None:
    out = subprocess.run(["ss", "-ltnpH", f"sport = :{port}"], capture_output=True,
                         text=True, check=False).stdout
    found = re.search(r"pid=(\d+)", out)
    return int(found.group(1)) if found else None


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def scrape_cpu_ms(urls: dict[str, str]) -> dict[str, float]:
    """Each service's CPU milliseconds per scrape of its /metrics URL (by service name)."""
    costs: dict[str, float] = {}
    for name, url in urls.items():
        port = re.search(r":(\d+)/", url)
        pid = _pid_listening(int(port.group(1))) if port else None
        if pid is None:
            continue
        before = _cpu_s(pid)
        for _ in range(SCRAPES):
            with urllib.request.urlopen(url, timeout=10) as resp:
                resp.read()
        costs[name] = (_cpu_s(pid) - before) * 1000 / SCRAPES
    return costs

"""deploy/metrics_proxy.py with auth on, as real processes: a real Prometheus, configured
with the shipped deploy/prometheus/prometheus.yml (its relabelling through the proxy), scrapes
namesrv, a broker and the console, which all refuse unsigned requests.

namesrv and the broker are read signed with the proxy's identity (the rules
deploy/auth_init.py gives svc-metrics), the console after one login that later scrapes
reuse, and again once that session has ended. Refused: a target the
proxy was not given (400), an identity without admin read (502 with the service's 403), a
wrong secret (502 with the 401, and the console's refused login); the proxy keeps serving.
"""
from __future__ import annotations

import re
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml
from ferry.auth.credentials import Credentials

from tests.auth.http_support import NOBODY, WRONG_SECRET
from tests.console.test_login import start_secured_console
from tests.deploy.conftest import DEPLOY, Secured, compose_identity
from tests.support.procs import Proc, free_port, spawn, wait_until_ready
from tests.support.prometheus import Prometheus, start_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

METRICS = compose_identity("svc-metrics")


def start_proxy(s: Secured, name: str, creds: Credentials, *,
                console: str = "") -> tuple[Proc, str]:
    port = free_port()
    proc = spawn(name, [sys.executable, str(DEPLOY / "metrics_proxy.py"),
                        "--listen", f"127.0.0.1:{port}",
                        "--targets", f"{s.namesrv},{s.broker}", "--console", console or s.console],
                 s.mesh.workdir / name,
                 {"FERRY_ACCESS_KEY": creds.access_key, "FERRY_SECRET_KEY": creds.secret_key})
    wait_until_ready(proc, f"http://127.0.0.1:{port}/healthz", timeout_s=30)
    return proc, f"127.0.0.1:{port}"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=15) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def shipped_config(s: Secured, proxy: str) -> str:
    """deploy/prometheus/prometheus.yml with this mesh's services as the targets of their
    jobs, the proxy's address in the relabelling, and scrapes every second."""
    config = yaml.safe_load((DEPLOY / "prometheus" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "scrape_timeout": "1s"}
    here = {"namesrv": s.namesrv, "broker": s.broker, "console": s.console}
    jobs = [j for j in config["scrape_configs"] if j["job_name"] in here]
    for job in jobs:
        job["static_configs"] = [{"targets": [here[job["job_name"]]]}]
        for rule in job["relabel_configs"]:
            if rule.get("replacement") == "metrics-proxy:9100":
                rule["replacement"] = proxy
    assert len(jobs) == 3
    config["scrape_configs"] = jobs
    return str(yaml.safe_dump(config))


def test_prometheus_scrapes_the_services_through_the_proxy(secured: Secured,
                                                           tmp_path: Path) -> None:
    s = secured
    for target in (s.namesrv, s.broker, s.console):   # what Prometheus alone would get
        assert get(f"http://{target}/metrics")[0] == 401, target
    proxy, address = start_proxy(s, "proxy", METRICS)
    prom: Prometheus | None = None
    try:
        prom = start_prometheus(tmp_path / "prometheus", {},
                                config=shipped_config(s, address))
        for job in ("namesrv", "broker", "console"):
            assert prom.wait_value(f'up{{job="{job}"}}', 1) == 1, job
        # each series names the service it came from, not the proxy
        assert prom.wait_value(f'ferry_namesrv_brokers{{instance="{s.namesrv}"}}', 1) == 1
        assert prom.value(f'count(ferry_broker_store_size_bytes{{instance="{s.broker}"}})') == 1
        # the console: one login (the proxy's session), kept over the later scrapes
        assert prom.wait_value('count_over_time(up{job="console"}[1m]) >= bool 5', 1) == 1
        assert prom.value("ferry_console_sessions") == 1
        assert prom.value("ferry_console_logins_total") == 1
    finally:
        if prom is not None:
            prom.proc.stop()
        proxy.stop()


def test_the_console_is_read_again_after_its_session_ended(secured: Secured) -> None:
    """A console session ends (its TTL, or a console restart): the proxy's cookie is then
    refused (401), and it logs in again rather than failing every later scrape."""
    s = secured
    console, url = start_secured_console(s.mesh, "console-short",
                                         FERRY_CONSOLE_SESSION_TTL_MS="2000")
    target = url.removeprefix("http://")
    proxy, address = start_proxy(s, "proxy-relogin", METRICS, console=target)
    try:
        logins = []
        deadline = time.monotonic() + 30
        while len(set(logins)) < 2 and time.monotonic() < deadline:
            status, text = get(f"http://{address}/metrics?target={target}")
            assert status == 200, text    # every scrape, across the session's end
            logins.append(re.search(r"^ferry_console_logins_total\S* (\S+)$", text, re.M)[1])
            time.sleep(0.5)
        assert sorted(set(logins)) == ["1.0", "2.0"], logins
    finally:
        proxy.stop()
        console.stop()


def test_the_proxy_refuses_what_it_was_not_given_and_says_why(secured: Secured) -> None:
    s = secured
    good, good_address = start_proxy(s, "proxy-good", METRICS)
    nobody, nobody_address = start_proxy(s, "proxy-nobody", NOBODY)
    wrong, wrong_address = start_proxy(s, "proxy-wrong", WRONG_SECRET)
    try:
        for target in ("127.0.0.1:1", "", f"{s.namesrv}/../v1/users"):
            status, text = get(f"http://{good_address}/metrics?target={target}")
            assert status == 400 and "not one this proxy scrapes" in text, target
        status, text = get(f"http://{nobody_address}/metrics?target={s.namesrv}")
        assert status == 502 and "answered 403" in text, text
        status, text = get(f"http://{wrong_address}/metrics?target={s.broker}")
        assert status == 502 and "answered 401" in text, text
        status, text = get(f"http://{wrong_address}/metrics?target={s.console}")
        assert status == 502 and "refused the login of admin" in text, text
        # and every proxy keeps serving
        for address in (good_address, nobody_address, wrong_address):
            assert get(f"http://{address}/healthz")[0] == 200
        status, text = get(f"http://{good_address}/metrics?target={s.namesrv}")
        assert status == 200 and "ferry_namesrv_brokers" in text
    finally:
        for proc in (good, nobody, wrong):
            proc.stop()

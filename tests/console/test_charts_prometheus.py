"""The chart pages drawn from a real Prometheus (Debian's `prometheus`, FERRY_CONSOLE_PROMETHEUS_URL)
scraping the package's brokers, in headless Chromium; and, with a Prometheus that does not
answer, from the console's own samples under a notice.

Traffic: two waves of messages, each left HELD_S in the store before the group reads it
(a counter's first sample is not an increase to `rate()`: the second wave is what the
rates and the latency show), then UNREAD more left for a lag. The Prometheus-backed console
starts after all that: its charts reach back before it started, which its own samples
cannot.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ferry import Producer
from selenium.webdriver.common.by import By

from tests.console.conftest import ConsoleMesh, shoot, start_console
from tests.console.test_charts import _check_chart, _legend_value, _path_points, held_waves
from tests.console.test_pages import _open, _until
from tests.support.procs import free_port
from tests.support.prometheus import Prometheus, start_prometheus

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC, GROUP = "prom-charted", "prom-charted-readers"
WAVES, PER_WAVE, UNREAD, HELD_S = 2, 6, 5, 2.0


@pytest.fixture(scope="module")
def prometheus(console_mesh: ConsoleMesh, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[Prometheus]:
    targets = {name: f"http://127.0.0.1:{b.http_port}/metrics"
               for name, b in console_mesh.mesh.brokers.items()}
    prom = start_prometheus(tmp_path_factory.mktemp("prometheus"), targets)
    try:
        yield prom
    finally:
        prom.proc.stop()


async def _traffic(namesrv: str) -> None:
    await held_waves(namesrv, TOPIC, GROUP, 2, WAVES, PER_WAVE, HELD_S)
    async with Producer(namesrv=namesrv) as producer:
        for i in range(UNREAD):
            await producer.send_and_wait(TOPIC, f"unread-{i}".encode())


def _first_tick_s(chart: Any) -> float:
    """The time of a chart's first point (its first x tick, HH:MM:SS UTC, today)."""
    text = chart.find_elements(By.CSS_SELECTOR, ".chart-tick-x")[0].text
    clock = dt.datetime.strptime(text, "%H:%M:%S").time()
    today = dt.datetime.now(dt.UTC).date()
    return dt.datetime.combine(today, clock, tzinfo=dt.UTC).timestamp()


def test_charts_from_prometheus(console_mesh: ConsoleMesh, prometheus: Prometheus, driver: Any,
                                shots: Path) -> None:
    asyncio.run(_traffic(console_mesh.mesh.namesrv))
    lag = f'sum(ferry_broker_group_lag{{messaging_consumer_group_name="{GROUP}"}})'
    assert prometheus.wait_value(lag, UNREAD) == UNREAD
    started_s = time.time()
    proc, port = start_console(
        console_mesh.mesh, f"127.0.0.1:{console_mesh.scheduler.http_port}",
        f"127.0.0.1:{console_mesh.checker.http_port}",
        {"FERRY_CONSOLE_PROMETHEUS_URL": prometheus.url}, name="console-prometheus")
    try:
        _open(driver, f"http://127.0.0.1:{port}/console/groups/{GROUP}")
        assert driver.find_element(By.ID, "charts-source").text.startswith(
            f"From Prometheus at {prometheus.url}")
        assert not driver.find_elements(By.ID, "charts-notice")
        _check_chart(driver, "chart-group-lag", f"Lag of {GROUP}", ["lag"], shots)
        _check_chart(driver, "chart-group-rate", f"Consume rate of {GROUP}", ["consumed"],
                     shots)
        _check_chart(driver, "chart-group-latency", f"End-to-end latency of {GROUP}",
                     ["latency"], shots)
        chart = driver.find_element(By.ID, "chart-group-lag")
        assert _legend_value(chart) == UNREAD
        # points from before this console existed: Prometheus's, not its own samples
        assert _first_tick_s(chart) < started_s - 1
        assert _legend_value(driver.find_element(By.ID, "chart-group-latency")) >= HELD_S * 1000
        shoot(driver, shots, "charts-prometheus-group")

        _open(driver, f"http://127.0.0.1:{port}/console/topics/{TOPIC}")
        _check_chart(driver, "chart-topic-rate", f"Produce and consume rate of {TOPIC}",
                     ["produced", "consumed"], shots)
        _check_chart(driver, "chart-topic-latency", f"End-to-end latency of {TOPIC}, by group",
                     [GROUP], shots)
        _open(driver, f"http://127.0.0.1:{port}/console/cluster")
        _check_chart(driver, "chart-disk", "Disk used", ["broker-a", "broker-b"], shots)
        _check_chart(driver, "chart-commit-log", "Commit log size", ["broker-a", "broker-b"],
                     shots)
        shoot(driver, shots, "charts-prometheus-cluster")
    finally:
        proc.stop()


def test_an_unreachable_prometheus_leaves_own_samples_and_a_notice(
        console_mesh: ConsoleMesh, driver: Any, shots: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"   # nothing listens there
    proc, port = start_console(
        console_mesh.mesh, f"127.0.0.1:{console_mesh.scheduler.http_port}",
        f"127.0.0.1:{console_mesh.checker.http_port}",
        {"FERRY_CONSOLE_PROMETHEUS_URL": nowhere}, name="console-no-prometheus")
    url = f"http://127.0.0.1:{port}/console/cluster"

    def sampled() -> bool:
        _open(driver, url)
        paths = driver.find_element(By.ID, "chart-commit-log").find_elements(
            By.CSS_SELECTOR, "path.chart-line")
        return bool(paths) and all(_path_points(p) for p in paths)

    try:
        assert _until(sampled, 30)
        notice = driver.find_element(By.ID, "charts-notice").text
        assert f"Prometheus at {nowhere} is unreachable" in notice
        assert "console's own samples instead" in notice
        assert driver.find_element(By.ID, "charts-source").text.startswith(
            "Sampled by the console every 1 s")
        _check_chart(driver, "chart-commit-log", "Commit log size",
                     ["broker-a/0", "broker-b/0"], shots)
        shoot(driver, shots, "charts-prometheus-unreachable")
        assert proc.alive()
    finally:
        proc.stop()

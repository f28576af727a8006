"""The console's charts in headless Chromium: a topic's produce and consume rate, a group's lag
and consume rate, the brokers' disk, commit log and flush lag, drawn from the console's own
samples (FERRY_CONSOLE_RATE_INTERVAL_MS=1000 in the package's mesh) of real traffic.

Each chart is checked in the page (an SVG with its title, both axes, tick labels, a path with
points and a legend) and in a screenshot of it (pixels of its line colour); the PNGs are kept
under the test's tmp dir.
"""
from __future__ import annotations

import asyncio
import io
import re
import time
from pathlib import Path
from typing import Any

import pytest
from ferry import Admin, Consumer, Producer
from ferry_console.svg_chart import COLOURS
from PIL import Image
from selenium.webdriver.common.by import By

from tests.client.util import FAST
from tests.console.conftest import ConsoleMesh, shoot
from tests.console.test_pages import _open, _until

pytestmark = pytest.mark.integration

TOPIC, GROUP = "charted", "charted-readers"
WAVES, PER_WAVE, LEFT_UNREAD = 4, 10, 7


async def _traffic(namesrv: str) -> None:
    """Waves of messages over a few sampling rounds, consumed as they come (the group
    commits as it goes), then LEFT_UNREAD more with the group stopped: a lag."""
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(TOPIC, queues=2)
    async with Producer(namesrv=namesrv) as producer, \
            Consumer(TOPIC, group=GROUP, namesrv=namesrv, auto_offset_reset="earliest",
                     **FAST) as consumer:
        got = 0
        for wave in range(WAVES):
            for i in range(PER_WAVE):
                await producer.send_and_wait(TOPIC, f"{wave}-{i}".encode())
            deadline = time.monotonic() + 30
            while got < (wave + 1) * PER_WAVE:
                assert time.monotonic() < deadline, f"consumed {got} of {(wave + 1) * PER_WAVE}"
                batch = await consumer.getmany(timeout_ms=300)
                got += sum(len(v) for v in batch.values())
            await consumer.commit()
            await asyncio.sleep(1.5)   # into the next sampling round (not a timing assertion)
    async with Producer(namesrv=namesrv) as producer:
        for i in range(LEFT_UNREAD):
            await producer.send_and_wait(TOPIC, f"unread-{i}".encode())


@pytest.fixture(scope="module")
def traffic(console_mesh: ConsoleMesh) -> None:
    asyncio.run(_traffic(console_mesh.mesh.namesrv))


async def _create(namesrv: str, topic: str) -> None:
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(topic, queues=1)


def _path_points(path: Any) -> list[tuple[float, float]]:
    return [(float(x), float(y)) for x, y in
            re.findall(r"[ML]([\d.]+),([\d.]+)", path.get_attribute("d") or "")]


def _baseline(chart: Any) -> float:
    """The y of the x axis: a value above 0 is drawn above it."""
    return float(chart.find_element(By.CSS_SELECTOR, ".chart-axis-x").get_attribute("y1"))


def _rises(driver: Any, url: str, chart_id: str, series: str) -> bool:
    """The page at `url` draws `series` in `chart_id` with 2+ points, one of them above 0."""
    _open(driver, url)
    chart = driver.find_element(By.ID, chart_id)
    paths = chart.find_elements(By.CSS_SELECTOR, f'path.chart-line[data-series="{series}"]')
    if not paths:
        return False
    points = _path_points(paths[0])
    return len(points) >= 2 and any(y < _baseline(chart) for _, y in points)


def _check_chart(driver: Any, chart_id: str, title: str, series: list[str],
                 shots: Path) -> None:
    """The chart is an SVG with its title, axes, ticks, a non-empty path per series and its
    legend; its screenshot shows each line's colour."""
    chart = driver.find_element(By.ID, chart_id)
    assert chart.tag_name == "svg"
    assert chart.find_element(By.CSS_SELECTOR, ".chart-title").text == title
    assert len(chart.find_elements(By.CSS_SELECTOR, ".chart-axis")) == 2
    assert [t.text for t in chart.find_elements(By.CSS_SELECTOR, ".chart-tick-y")][0] == "0"
    assert all(re.fullmatch(r"\d\d:\d\d:\d\d", t.text)
               for t in chart.find_elements(By.CSS_SELECTOR, ".chart-tick-x"))
    paths = chart.find_elements(By.CSS_SELECTOR, "path.chart-line")
    assert [p.get_attribute("data-series") for p in paths] == series
    assert all(_path_points(p) for p in paths)
    legend = [t.text for t in chart.find_elements(By.CSS_SELECTOR, ".chart-legend")]
    assert [s.split(" (")[0] for s in legend] == series
    png = chart.screenshot_as_png
    (shots / f"{chart_id}.png").write_bytes(png)
    image = Image.open(io.BytesIO(png)).convert("RGB")
    seen = {rgb for _, rgb in image.getcolors(maxcolors=1 << 24) or ()}
    for colour in COLOURS[:len(series)]:
        rgb = tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))
        assert any(all(abs(a - b) <= 40 for a, b in zip(px, rgb, strict=True)) for px in seen), \
            f"{chart_id}: no pixel of {colour} ({series}) in its screenshot"


def test_topic_chart(console_mesh: ConsoleMesh, traffic: None, driver: Any, shots: Path) -> None:
    url = f"{console_mesh.url}/console/topics/{TOPIC}"
    assert _until(lambda: _rises(driver, url, "chart-topic-rate", "produced"), 30)
    assert _until(lambda: _rises(driver, url, "chart-topic-rate", "consumed"), 30)
    _check_chart(driver, "chart-topic-rate", f"Produce and consume rate of {TOPIC}",
                 ["produced", "consumed"], shots)
    assert "Sampled by the console every 1 s" in driver.find_element(By.ID, "charts").text
    shoot(driver, shots, "charts-topic")


def test_group_charts(console_mesh: ConsoleMesh, traffic: None, driver: Any,
                      shots: Path) -> None:
    url = f"{console_mesh.url}/console/groups/{GROUP}"
    assert _until(lambda: _rises(driver, url, "chart-group-rate", "consumed"), 30)
    assert _until(lambda: _rises(driver, url, "chart-group-lag", "lag"), 30)
    assert driver.find_element(By.ID, "total-lag").text == str(LEFT_UNREAD)
    _check_chart(driver, "chart-group-lag", f"Lag of {GROUP}", ["lag"], shots)
    _check_chart(driver, "chart-group-rate", f"Consume rate of {GROUP}", ["consumed"], shots)
    shoot(driver, shots, "charts-group")


def test_cluster_charts(console_mesh: ConsoleMesh, traffic: None, driver: Any,
                        shots: Path) -> None:
    members = ["broker-a/0", "broker-b/0"]
    _open(driver, console_mesh.url + "/console/cluster")
    for chart_id, title in (("chart-disk", "Disk used"), ("chart-commit-log", "Commit log size"),
                            ("chart-flush-lag", "Flush lag (written, not yet on disk)")):
        _check_chart(driver, chart_id, title, members, shots)
    assert _until(lambda: _rises(driver, console_mesh.url + "/console/cluster",
                                 "chart-commit-log", "broker-a/0"), 30)
    shoot(driver, shots, "charts-cluster")


LATE_TOPIC, LATE_GROUP, LATE_WAVES, HELD_S = "charted-late", "charted-late-readers", 2, 2.5


async def held_waves(namesrv: str, topic: str, group: str, queues: int, waves: int,
                     per_wave: int, held_s: float) -> None:
    """`topic` (made with `queues` queues) gets `waves` waves of `per_wave` messages, each
    left `held_s` in the store before a new consumer of `group` reads and commits it: every
    delivery is at least `held_s` after its store. A pause after each wave puts the next one
    in a later sampling round or scrape (not a timing assertion)."""
    async with Admin(namesrv=namesrv) as admin:
        await admin.create_topic(topic, queues=queues)
    for wave in range(waves):
        async with Producer(namesrv=namesrv) as producer:
            for i in range(per_wave):
                await producer.send_and_wait(topic, f"{wave}-{i}".encode())
        await asyncio.sleep(held_s)
        async with Consumer(topic, group=group, namesrv=namesrv,
                            auto_offset_reset="earliest", **FAST) as consumer:
            got, deadline = 0, time.monotonic() + 30
            while got < per_wave:
                assert time.monotonic() < deadline, f"consumed {got} of {per_wave}"
                batch = await consumer.getmany(timeout_ms=300)
                got += sum(len(v) for v in batch.values())
            await consumer.commit()
        await asyncio.sleep(1.5)


def _legend_value(chart: Any) -> float:
    """The latest value a one-line chart's legend shows: `latency (2.6k)` -> 2600."""
    text = chart.find_element(By.CSS_SELECTOR, ".chart-legend").text
    number = re.fullmatch(r".* \(([\d.]+)([kMG]?)\)", text)
    assert number, text
    return float(number[1]) * {"": 1, "k": 1e3, "M": 1e6, "G": 1e9}[number[2]]


def _latency_drawn(driver: Any, url: str, chart_id: str, series: str) -> bool:
    _open(driver, url)
    chart = driver.find_element(By.ID, chart_id)
    return len(_path_points(chart.find_elements(
        By.CSS_SELECTOR, f'path.chart-line[data-series="{series}"]')[0])) >= LATE_WAVES \
        if chart.find_elements(By.CSS_SELECTOR, "path.chart-line") else False


def test_latency_charts(console_mesh: ConsoleMesh, driver: Any, shots: Path) -> None:
    """End-to-end latency (store to delivery) on the group's and the topic's page: a point
    per wave, each at least the HELD_S the messages waited, drawn in its colour."""
    asyncio.run(held_waves(console_mesh.mesh.namesrv, LATE_TOPIC, LATE_GROUP, 1, LATE_WAVES,
                           PER_WAVE, HELD_S))
    for page, chart_id, title, series in (
            (f"groups/{LATE_GROUP}", "chart-group-latency",
             f"End-to-end latency of {LATE_GROUP}", "latency"),
            (f"topics/{LATE_TOPIC}", "chart-topic-latency",
             f"End-to-end latency of {LATE_TOPIC}, by group", LATE_GROUP)):
        url = f"{console_mesh.url}/console/{page}"
        assert _until(lambda u=url, c=chart_id, s=series: _latency_drawn(driver, u, c, s),
                      30), page
        _check_chart(driver, chart_id, title, [series], shots)
        chart = driver.find_element(By.ID, chart_id)
        assert _legend_value(chart) >= HELD_S * 1000
        assert chart.find_element(By.CSS_SELECTOR, ".chart-unit").text == "ms"
        shoot(driver, shots, f"charts-latency-{page.split('/')[0]}")


def test_a_topic_without_samples_says_so(console_mesh: ConsoleMesh, driver: Any) -> None:
    asyncio.run(_create(console_mesh.mesh.namesrv, "charted-empty"))
    # no sample has seen it yet, or only its zero rates
    _open(driver, f"{console_mesh.url}/console/topics/charted-empty")
    chart = driver.find_element(By.ID, "chart-topic-rate")
    empty = chart.find_elements(By.CSS_SELECTOR, ".chart-empty")
    paths = chart.find_elements(By.CSS_SELECTOR, "path.chart-line")
    assert (empty and empty[0].text == "no samples yet" and not paths) or \
        all(y == _baseline(chart) for p in paths for _, y in _path_points(p))

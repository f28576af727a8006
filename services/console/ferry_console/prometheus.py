"""Chart series from Prometheus (FERRY_CONSOLE_PROMETHEUS_URL) instead of the console's samples.

Each chart series of `rates.py` has a PromQL expression over the brokers'
metrics (docs/metrics.md), asked with `query_range` over the window the
console's own samples would cover: `CHART_POINTS` steps of
`RATE_INTERVAL_MS`, ending now. A rate is `rate()` over `rate_window_s(step)`:
four steps, at least a minute (so that it spans several scrapes whatever the
scrape interval). Rates and lag leave slaves out, as the console's sampler
does (a slave holds the same queues and offsets): a slave is a target that
reports `ferry_broker_replication_lag_bytes{role="slave"}`. Latency counts
every member (each counts the pulls it serves). A line is named by its group
(a topic's latency per group), else its scrape job (the per-member charts),
else its instance.

`PrometheusError` says why Prometheus gave no series (unreachable, an error
status, not its answer format): the page then draws its own samples and says
so.
"""
from __future__ import annotations

import asyncio
import math
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from ferry_console.series import Points

TOPIC_LABEL = "messaging_destination_name"   # ferry.service.metrics TOPIC, as Prometheus names it
GROUP_LABEL = "messaging_consumer_group_name"
NOT_SLAVE = ' unless on (job, instance) ferry_broker_replication_lag_bytes{role="slave"}'
MIN_RATE_WINDOW_S = 60


class PrometheusError(Exception):
    """Prometheus did not answer a query with series."""


def rate_window_s(step_s: float) -> int:
    """The range of `rate()`: four steps, at least MIN_RATE_WINDOW_S."""
    return max(MIN_RATE_WINDOW_S, math.ceil(4 * step_s))


def _match(label: str, value: str) -> str:
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'{{{label}="{escaped}"}}'


def _rate(metric: str, sel: str, window: str) -> str:
    return f"sum(rate({metric}{sel}[{window}]){NOT_SLAVE})"


def _latency_ms(sel: str, window: str, by: str = "") -> str:
    return (f"1000 * sum{by}(rate(ferry_broker_group_delivery_latency_seconds_total{sel}"
            f"[{window}])) / sum{by}(rate(ferry_broker_group_delivered_total{sel}[{window}]))")


def query(metric: str, subject: str, step_s: float) -> str:
    """The PromQL of one series of rates.py (`topic.produce_rate` of a topic, ...); for the
    `broker.*` metrics `subject` is ignored (one series per member)."""
    window = f"{rate_window_s(step_s)}s"
    kind = metric.split(".")[0]
    sel = _match(TOPIC_LABEL if kind == "topic" else GROUP_LABEL, subject)
    expressions = {
        "topic.produce_rate": lambda: _rate("ferry_broker_topic_messages_total", sel, window),
        "topic.consume_rate": lambda: _rate("ferry_broker_group_committed_total", sel, window),
        "group.consume_rate": lambda: _rate("ferry_broker_group_committed_total", sel, window),
        "group.lag": lambda: f"sum(ferry_broker_group_lag{sel}{NOT_SLAVE})",
        "group.latency_ms": lambda: _latency_ms(sel, window),
        "topic.group_latency_ms": lambda: _latency_ms(sel, window, f" by ({GROUP_LABEL}) "),
        "broker.disk_used_percent": lambda: "100 * ferry_broker_disk_used_ratio",
        "broker.commit_log_bytes": lambda: "ferry_broker_store_size_bytes",
        "broker.flush_lag_bytes": lambda: "ferry_broker_flush_lag_bytes",
    }
    if metric not in expressions:
        raise ValueError(f"no PromQL for chart series {metric!r}")
    return expressions[metric]()


@dataclass(frozen=True)
class Series:
    """One series of a query_range answer: its label (group, job, instance or "") and
    points."""

    label: str
    points: Points


def parse_matrix(body: Any) -> list[Series]:
    """The series of a query_range answer (non-finite values left out: a latency of a
    round without deliveries is 0/0); PrometheusError when it is not one."""
    try:
        if body.get("status") != "success":
            raise PrometheusError(f"Prometheus answered {body.get('errorType', 'an error')}: "
                                  f"{body.get('error', '')}")
        data = body["data"]
        if data.get("resultType") != "matrix":
            raise PrometheusError(f"not a range result: {data.get('resultType')!r}")
        out = []
        for result in data["result"]:
            labels = result.get("metric") or {}
            points = [(float(t), float(v)) for t, v in result["values"]
                      if math.isfinite(float(v))]
            name = labels.get(GROUP_LABEL) or labels.get("job") or labels.get("instance")
            out.append(Series(str(name or ""), points))
        return sorted(out, key=lambda series: series.label)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise PrometheusError(f"not a Prometheus answer: {exc}") from exc


class PrometheusCharts:
    """query_range against one Prometheus, over the console's chart window."""

    def __init__(self, url: str, timeout_ms: int, step_ms: int, points: int) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_ms / 1000
        self.step_s = step_ms / 1000
        self.points = points

    async def ranges(self, metrics: Sequence[tuple[str, str]]) -> list[list[Series]]:
        """The series of each (metric, subject), asked at once; PrometheusError when any
        query failed (the page then falls back whole, not chart by chart)."""
        end = time.time()
        start = end - self.step_s * (self.points - 1)
        try:
            async with aiohttp.ClientSession(
                    timeout=aiohttp.ClientTimeout(total=self.timeout_s)) as session:
                return list(await asyncio.gather(*(
                    self._range(session, query(metric, subject, self.step_s), start, end)
                    for metric, subject in metrics)))
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} is unreachable "
                                  f"({type(exc).__name__}: {exc})") from exc

    async def _range(self, session: aiohttp.ClientSession, expr: str, start: float,
                     end: float) -> list[Series]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}",
                  "step": f"{self.step_s:g}"}
        url = f"{self.url}/api/v1/query_range?{urllib.parse.urlencode(params)}"
        async with session.get(url) as resp:
            try:
                body = await resp.json(content_type=None)
            except ValueError as exc:
                raise PrometheusError(f"Prometheus at {self.url} answered HTTP {resp.status} "
                                      "without JSON") from exc
        return parse_matrix(body)

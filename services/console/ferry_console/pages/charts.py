"""The charts a topic, group or cluster page shows, from the console's own samples (rates.py)
or, when FERRY_CONSOLE_PROMETHEUS_URL is set, from Prometheus (prometheus.py); a Prometheus
that does not answer leaves the page its own samples and a notice that says so.

The samples are read with the console's identity; a page shows a chart only
when the logged-in user (auth on) may read what it is drawn from: a topic's
produce rate with the topic (its queues' offsets, `Admin.describe_topic`),
everything else with the brokers' `/v1/stats` (admin `read`). A page asks
with the user's own clients, so a user who may not read the stats sees no
chart of them: the console's samples do not widen anyone's rights.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

from aiohttp import web
from markupsafe import Markup

from ferry_console.pages.common import SESSION, Console
from ferry_console.prometheus import PrometheusError
from ferry_console.series import SeriesKey
from ferry_console.sources import BrokerView, Sources
from ferry_console.svg_chart import Line, line_chart

log = logging.getLogger("ferry_console")

MAX_PROBES = 3   # brokers asked whether a user may read stats, before the page gives up


@dataclass(frozen=True)
class ChartPanel:
    """The SVG charts of one page and where their points came from: the console's own
    samples, or Prometheus (`prometheus_url`); `notice` says why Prometheus was not used."""

    charts: list[Markup]
    interval_s: float
    points: int
    prometheus_url: str = ""
    notice: str = ""


#: What a chart line is drawn from: (metric of rates.py, subject, legend label); a `broker.*`
#: metric draws one line per member, `topic.group_latency_ms` one per group (labelled so).
Spec = tuple[str, str, str]


async def _lines(c: Console, specs: list[Spec], members: Sequence[str] = ()
                 ) -> tuple[list[list[Line]], str, str]:
    """The lines of each spec, the Prometheus URL they came from ("" for the console's own
    samples) and the notice of a Prometheus that did not answer (then: own samples)."""
    notice = ""
    if c.prometheus is not None:
        try:
            answers = await c.prometheus.ranges([(m, subject) for m, subject, _ in specs])
            return ([[Line(label or series.label, series.points) for series in answer]
                     for (_m, _s, label), answer in zip(specs, answers, strict=True)],
                    c.prometheus.url, "")
        except PrometheusError as exc:
            log.warning("charts from the console's samples: %s", exc)
            notice = f"{exc}. These charts show the console's own samples instead."
    return [_own_lines(c, spec, members) for spec in specs], "", notice


def _own_lines(c: Console, spec: Spec, members: Sequence[str]) -> list[Line]:
    """The lines of one spec from the console's samples: one per broker member for a
    `broker.*` metric, one per group for a topic's latency by group, else one."""
    metric, subject, label = spec
    if metric.startswith("broker."):
        return [_line(c, metric, member, member) for member in members]
    if metric == "topic.group_latency_ms":
        prefix = f"{subject} "
        return [_line(c, metric, pair, pair[len(prefix):])
                for pair in c.rates.series.subjects(metric, prefix)]
    return [_line(c, metric, subject, label)]


def _panel(c: Console, charts: list[Markup], prometheus_url: str, notice: str) -> ChartPanel:
    return ChartPanel(charts, c.rates.interval_ms / 1000, c.rates.series.max_points,
                      prometheus_url, notice)


def _line(c: Console, metric: str, subject: str, label: str) -> Line:
    return Line(label, c.rates.series.points(SeriesKey(metric, subject)))


def stats_were_read(request: web.Request, brokers: list[BrokerView]) -> bool:
    """Whether the page read the brokers' stats as its user (auth off: always)."""
    return request.get(SESSION) is None or any(b.stats is not None for b in brokers)


async def user_reads_stats(request: web.Request, src: Sources) -> bool:
    """Whether this page's user may read the brokers' stats: asked of the first broker that
    answers, of MAX_PROBES at most (auth off: always; none answers: no)."""
    if request.get(SESSION) is None:
        return True
    listed = await src.namesrv.call("GET", "/v1/brokers")
    members = [b for b in listed.get("brokers", []) if isinstance(b, dict)]
    for b in members[:MAX_PROBES]:
        doc, why = await src.read_json(str(b.get("http_addr") or ""), "/v1/stats")
        if doc is not None or why != "unreachable":
            return doc is not None
    return False


async def topic_charts(c: Console, topic: str, consumed: bool) -> ChartPanel:
    """Produce rate of `topic` and, when `consumed`, its consume rate (over its groups) and
    its end-to-end latency, one line per group."""
    specs = [("topic.produce_rate", topic, "produced")]
    if consumed:
        specs += [("topic.consume_rate", topic, "consumed"),
                  ("topic.group_latency_ms", topic, "")]
    lines, url, notice = await _lines(c, specs)
    if not consumed:
        charts = [line_chart(f"Produce rate of {topic}", lines[0], "msg/s", "chart-topic-rate")]
    else:
        charts = [line_chart(f"Produce and consume rate of {topic}", lines[0] + lines[1],
                             "msg/s", "chart-topic-rate"),
                  line_chart(f"End-to-end latency of {topic}, by group", lines[2], "ms",
                             "chart-topic-latency")]
    return _panel(c, charts, url, notice)


async def group_charts(c: Console, group: str) -> ChartPanel:
    """Lag, consume rate and end-to-end latency of `group`, over all its topics."""
    (lag, rate, latency), url, notice = await _lines(
        c, [("group.lag", group, "lag"), ("group.consume_rate", group, "consumed"),
            ("group.latency_ms", group, "latency")])
    return _panel(c, [
        line_chart(f"Lag of {group}", lag, "messages", "chart-group-lag"),
        line_chart(f"Consume rate of {group}", rate, "msg/s", "chart-group-rate"),
        line_chart(f"End-to-end latency of {group}", latency, "ms", "chart-group-latency")],
        url, notice)


async def cluster_charts(c: Console, members: list[str]) -> ChartPanel:
    """Disk used, commit-log size and flush lag, one line per broker member."""
    (disk, log_size, flush), url, notice = await _lines(
        c, [("broker.disk_used_percent", "", ""), ("broker.commit_log_bytes", "", ""),
            ("broker.flush_lag_bytes", "", "")], members)
    return _panel(c, [
        line_chart("Disk used", disk, "%", "chart-disk"),
        line_chart("Commit log size", log_size, "bytes", "chart-commit-log"),
        line_chart("Flush lag (written, not yet on disk)", flush, "bytes", "chart-flush-lag")],
        url, notice)

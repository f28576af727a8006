"""The charts a topic, group or cluster page shows, from the console's own samples (rates.py).

The samples are read with the console's identity; a page shows a chart only
when the logged-in user (auth on) may read what it is drawn from: a topic's
produce rate with the topic (its queues' offsets, `Admin.describe_topic`),
everything else with the brokers' `/v1/stats` (admin `read`). A page asks
with the user's own clients, so a user who may not read the stats sees no
chart of them: the console's samples do not widen anyone's rights.
"""
from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web
from markupsafe import Markup

from ferry_console.pages.common import SESSION, Console
from ferry_console.series import SeriesKey
from ferry_console.sources import BrokerView, Sources
from ferry_console.svg_chart import Line, line_chart

MAX_PROBES = 3   # brokers asked whether a user may read stats, before the page gives up


@dataclass(frozen=True)
class ChartPanel:
    """The SVG charts of one page and how they were sampled."""

    charts: list[Markup]
    interval_s: float
    points: int


def _panel(c: Console, charts: list[Markup]) -> ChartPanel:
    return ChartPanel(charts, c.rates.interval_ms / 1000, c.rates.series.max_points)


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


def topic_charts(c: Console, topic: str, consumed: bool) -> ChartPanel:
    """Produce rate of `topic` and, when `consumed`, its consume rate and end-to-end latency
    (over its groups)."""
    rates = [_line(c, "topic.produce_rate", topic, "produced")]
    title = f"Produce rate of {topic}"
    if consumed:
        rates.append(_line(c, "topic.consume_rate", topic, "consumed"))
        title = f"Produce and consume rate of {topic}"
    charts = [line_chart(title, rates, "msg/s", "chart-topic-rate")]
    if consumed:
        charts.append(latency_chart(f"End-to-end latency of {topic}",
                                    _line(c, "topic.latency_ms", topic, "all groups"),
                                    "chart-topic-latency"))
    return _panel(c, charts)


def latency_chart(title: str, line: Line, chart_id: str) -> Markup:
    """The mean time from store to delivery of the messages delivered in each round."""
    return line_chart(title, [line], "ms", chart_id)


def group_charts(c: Console, group: str) -> ChartPanel:
    """Lag, consume rate and end-to-end latency of `group`, over all its topics."""
    return _panel(c, [
        line_chart(f"Lag of {group}", [_line(c, "group.lag", group, "lag")], "messages",
                   "chart-group-lag"),
        line_chart(f"Consume rate of {group}", [_line(c, "group.consume_rate", group,
                                                      "consumed")], "msg/s",
                   "chart-group-rate"),
        latency_chart(f"End-to-end latency of {group}",
                      _line(c, "group.latency_ms", group, "latency"), "chart-group-latency")])


def cluster_charts(c: Console, members: list[str]) -> ChartPanel:
    """Disk used, commit-log size and flush lag, one line per broker member."""
    def lines(metric: str) -> list[Line]:
        return [_line(c, metric, m, m) for m in members]

    return _panel(c, [
        line_chart("Disk used", lines("broker.disk_used_percent"), "%", "chart-disk"),
        line_chart("Commit log size", lines("broker.commit_log_bytes"), "bytes",
                   "chart-commit-log"),
        line_chart("Flush lag (written, not yet on disk)", lines("broker.flush_lag_bytes"),
                   "bytes", "chart-flush-lag")])

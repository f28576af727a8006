"""The pipeline report: `spark/jobs/report.py`, `make spark-report`.

Per topic, consumer group and hop: end-to-end latency (p50/p95/p99), the
latency of every hop since the send, throughput per minute, retries and
dead letters, and the groups' lag over time; written as Parquet tables under
`<out>/report/` plus one self-contained HTML page `<out>/report/report.html`.
Where each figure comes from is in docs/spark.md ("The report") and on the
page under each section's title.
"""
from __future__ import annotations

import argparse
import datetime as dt
import sys
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from ferry.names import DLQ_PREFIX, RETRY_PREFIX
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ferry_spark.jobs import common, lag, metrics, render, traces
from ferry_spark.jobs.common import to_pandas

#: The columns of the topics that the report reads (the rest of the schema stays unread).
MESSAGE_COLUMNS = ("topic", "broker", "queue_id", "queue_offset", "store_ts", "properties")
TABLES = ("e2e", "hops", "deliveries", "throughput", "retries", "lag", "lag_now")
#: Columns of the per-message table (metrics.deliveries) kept in the report.
DELIVERY_COLUMNS = ("msg_id", "topic", "group", "outcome", "deliveries", "retries", "e2e_ms")


@dataclass
class Report:
    """The report's tables (small: one row per topic / group / hop / bucket) and its page."""

    e2e: pd.DataFrame
    hops: pd.DataFrame
    deliveries: pd.DataFrame   # per traced message and group
    throughput: pd.DataFrame
    retries: pd.DataFrame
    lag: pd.DataFrame
    lag_now: pd.DataFrame
    spans: int
    messages: int
    html_path: Path

    def table(self, name: str) -> pd.DataFrame:
        return getattr(self, name)  # type: ignore[no-any-return]


@dataclass(frozen=True)
class Scope:
    """What the report covers: user topics and consumer groups."""

    topics: list[str]
    groups: list[str]


def discover_scope(namesrv: str, spans: DataFrame, topics: list[str] | None) -> Scope:
    """Topics: given, else every user topic. Groups: configured at namesrv, owning a
    `%RETRY%` / `%DLQ%` topic, or seen in spans."""
    all_topics, groups = common.topics_and_groups(namesrv)
    from_spans = [r["group"] for r in spans.select("group").where(F.col("group").isNotNull())
                  .distinct().collect()]
    owners = [t.split("%", 2)[2] for t in all_topics
              if t.startswith((RETRY_PREFIX, DLQ_PREFIX))]
    user_topics = sorted(t for t in all_topics if not t.startswith("%"))
    return Scope(sorted(topics) if topics else user_topics,
                 sorted(set(groups) | set(from_spans) | set(owners)))


def read_messages(spark: SparkSession, namesrv: str, topics: list[str]) -> DataFrame | None:
    """The report's columns of every message of `topics` (those that exist)."""
    frames = [common.read_topic(spark, namesrv, t).select(*MESSAGE_COLUMNS)
              for t in common.topics_with_messages(namesrv, topics)]
    if not frames:
        return None
    out = frames[0]
    for more in frames[1:]:
        out = out.unionByName(more)
    return out


def retry_counts(spark: SparkSession, namesrv: str, spans: DataFrame, sends: DataFrame,
                 groups: list[str]) -> pd.DataFrame:
    """Per (group, origin topic): records in `%RETRY%<group>` / `%DLQ%<group>`, and the
    consumers' `retry` / `dlq` spans for traced messages."""
    frames = []
    for group in groups:
        for topic, column in zip(common.retry_and_dlq_topics(group), ("retried", "dead_lettered"),
                                 strict=True):
            if common.topics_with_messages(namesrv, [topic]):
                copies = common.read_topic(spark, namesrv, topic)
                frames.append(to_pandas(metrics.settled_copies(copies, group, column)))
    frames.append(to_pandas(metrics.span_settles(spans, sends)))
    columns = ("retried", "dead_lettered", "retry_spans", "dlq_spans")
    # each frame has some of the columns: summed per (group, topic), an absent count is 0
    totals: dict[tuple[str, str], dict[str, int]] = {}
    for frame in frames:
        for rec in frame.to_dict("records"):
            counts = totals.setdefault((rec["group"], rec["topic"]), dict.fromkeys(columns, 0))
            for col in columns:
                counts[col] += int(rec.get(col) or 0)
    return pd.DataFrame([{"group": g, "topic": t, **c} for (g, t), c in sorted(totals.items())],
                        columns=["group", "topic", *columns])


def lag_tables(namesrv: str, messages: DataFrame | None, spans: DataFrame, topics: list[str],
               bucket_s: int | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(lag over time, lag now) for every (topic of `topics`, group) seen receiving in the
    spans."""
    if messages is None:
        empty = lag.lag_over_time(pd.DataFrame(), pd.DataFrame(columns=["topic", "group"]), 1)
        return empty, lag.lag_now(namesrv, [])
    if bucket_s is None:
        bounds = messages.agg(F.min("store_ts"), F.max("store_ts")).first()
        span_s = (bounds[1] - bounds[0]).total_seconds() if bounds and bounds[0] else 0.0
        bucket_s = lag.bucket_for(span_s)
    produced = to_pandas(metrics.produced_positions(messages, bucket_s))
    consumed = to_pandas(metrics.consumed_positions(
        spans.where(F.col("topic").isin(*topics)), bucket_s))
    pairs = set(zip(consumed["topic"], consumed["group"], strict=True))
    return lag.lag_over_time(produced, consumed, bucket_s), lag.lag_now(namesrv, pairs)


def compute(spark: SparkSession, namesrv: str, trace_dir: str | None, out: Path,
            topics: list[str] | None = None, from_trace_topic: bool = True,
            bucket_s: int | None = None) -> dict[str, pd.DataFrame | int]:
    """Every table of the report (spans also written to `<out>/spans`)."""
    spans = traces.load_spans(spark, trace_dir, namesrv if from_trace_topic else None).cache()
    traces.write_spans(spans, str(out / "spans"))
    scope = discover_scope(namesrv, spans, topics)
    sends = metrics.message_sends(spans).where(F.col("msg_topic").isin(*scope.topics)).cache()
    per_message = metrics.deliveries(spans, sends).cache()
    messages = read_messages(spark, namesrv, scope.topics)
    if messages is not None:
        messages = messages.cache()
    throughput = pd.DataFrame(columns=["topic", "minute", "messages"]) if messages is None \
        else to_pandas(metrics.throughput_per_minute(messages))
    lag_df, lag_now_df = lag_tables(namesrv, messages, spans, scope.topics, bucket_s)
    tables: dict[str, pd.DataFrame | int] = {
        "e2e": to_pandas(metrics.e2e_latency(per_message)).sort_values(["topic", "group"]),
        "hops": to_pandas(metrics.hop_latency(spans, sends)).sort_values(["topic", "p50_ms"]),
        "deliveries": to_pandas(per_message.select(*DELIVERY_COLUMNS)),
        "throughput": throughput.sort_values(["topic", "minute"]),
        "retries": retry_counts(spark, namesrv, spans, sends, scope.groups),
        "lag": lag_df, "lag_now": lag_now_df,
        "spans": int(spans.count()),
        "messages": int(messages.count()) if messages is not None else 0,
    }
    for df in (spans, sends, per_message, messages):
        if df is not None:
            df.unpersist()
    return tables


def sections(t: dict[str, pd.DataFrame]) -> list[render.Section]:
    """The page's sections, in reading order."""
    e2e, hops = t["e2e"], t["hops"]
    retries = t["retries"]
    return [
        render.Section(
            "End-to-end latency per topic and group",
            "Traced messages (spans): from the producer's send to the group's last hop "
            "of the message (successful process, last receive, or the dead-letter send-back).",
            e2e, render.latency_bars(e2e, ["topic", "group"], "end-to-end latency")),
        render.Section(
            "Latency per hop (since the send)",
            "Spans of traced messages: each hop's end minus the send's start; duration = the "
            "span's own length. '-' = a hop of no consumer group (send, store, schedule, ...).",
            hops, render.latency_bars(hops, ["topic", "group", "hop"], "latency per hop")),
        render.Section(
            "Throughput per minute",
            "Every message of each topic (the ferry source), counted by store-time minute.",
            t["throughput"], render.time_lines(t["throughput"], ["topic"], "minute", "messages",
                                               "messages stored per minute", "messages")),
        render.Section(
            "Retries and dead letters per group",
            "retried / dead_lettered: records of %RETRY%<group> / %DLQ%<group> (the ferry "
            "source) by ORIGIN_TOPIC; *_spans: the consumers' retry / dlq spans (traced only).",
            retries, render.count_bars(retries, ["group", "topic"],
                                       ["retried", "dead_lettered"], "retries and DLQ")),
        render.Section(
            "Lag over time",
            "Queue end offsets by store time (the topics) minus the group's position from its "
            "receive spans; the last table: lag by the committed offsets now.",
            t["lag_now"], render.time_lines(t["lag"], ["topic", "group"], "ts", "lag",
                                            "messages not yet read", "messages", step=True)),
    ]


def write(tables: dict[str, pd.DataFrame | int], out: Path) -> Path:
    """Parquet per table under `<out>/report/` and the HTML page; returns the page's path."""
    report_dir = out / "report"
    report_dir.mkdir(parents=True, exist_ok=True)
    frames = {k: v for k, v in tables.items() if isinstance(v, pd.DataFrame)}
    for name in TABLES:
        frames[name].to_parquet(report_dir / f"{name}.parquet", index=False)
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    cards = {"messages": tables["messages"], "spans": tables["spans"],
             "traced messages": int(frames["e2e"]["messages"].sum()) if len(frames["e2e"]) else 0,
             "retried": int(frames["retries"]["retried"].sum()),
             "dead letters": int(frames["retries"]["dead_lettered"].sum())}
    page = render.page("Ferry pipeline report", f"generated {now}", cards, sections(frames))
    path = report_dir / "report.html"
    path.write_text(page, encoding="utf-8")
    return path


def run_report(spark: SparkSession, namesrv: str, trace_dir: str | None, out: str | Path,
               topics: list[str] | None = None, from_trace_topic: bool = True,
               bucket_s: int | None = None) -> Report:
    """Compute, write and return the report (what main() and the tests call)."""
    out = Path(out)
    tables = compute(spark, namesrv, trace_dir, out, topics, from_trace_topic, bucket_s)
    path = write(tables, out)
    frames = {k: v for k, v in tables.items() if isinstance(v, pd.DataFrame)}
    return Report(**frames, spans=int(tables["spans"]), messages=int(tables["messages"]),
                  html_path=path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="report", description=__doc__.split("\n")[0])
    common.add_common_args(parser, trace_dir=True)
    parser.add_argument("--no-trace-topic", action="store_true",
                        help="do not read spans from %%TRACE%%")   # argparse %-formats help
    parser.add_argument("--topic", action="append", help="report on this topic (repeatable; "
                        "default: every user topic)")
    parser.add_argument("--bucket-s", type=int, help="lag buckets in seconds (default: auto)")
    parser.add_argument("--out", default=common.DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    with common.job_session("ferry-report", args.master) as spark:
        rep = run_report(spark, args.namesrv, args.trace_dir or None, args.out, args.topic,
                         not args.no_trace_topic, args.bucket_s)
    print(f"report: {rep.messages} messages, {rep.spans} spans -> {rep.html_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

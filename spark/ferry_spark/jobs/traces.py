"""Trace spans → Parquet, partitioned by day and topic: `spark/jobs/traces.py`.

Spans come from the JSON-lines files every Ferry process writes under
`FERRY_TRACE_DIR` (`make up`: var/traces) and/or from the `%TRACE%` topic
through the `ferry` source (its bodies are the same span JSON, docs/tracing.md).
A span present in both (a broker writes both) is kept once, by span id.

One row per span, the attributes the report needs lifted into columns
(`hop`, `topic`, `msg_id`, `group`, ...), every attribute kept as text in
`attributes`, and `day` / `topic` as the partition columns.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from ferry_spark.jobs import common

#: The internal topic the trace exporter writes (docs/tracing.md).
TRACE_TOPIC = "%TRACE%"
#: The span JSON as written by ferry.telemetry.jsonl (attribute values read back as text).
SPAN_JSON_SCHEMA = T.StructType([
    T.StructField("trace_id", T.StringType()),
    T.StructField("span_id", T.StringType()),
    T.StructField("parent_span_id", T.StringType()),
    T.StructField("name", T.StringType()),
    T.StructField("kind", T.StringType()),
    T.StructField("start_ns", T.LongType()),
    T.StructField("end_ns", T.LongType()),
    T.StructField("status", T.StringType()),
    T.StructField("status_message", T.StringType()),
    T.StructField("service", T.StringType()),
    T.StructField("attributes", T.MapType(T.StringType(), T.StringType())),
])
#: Span attributes lifted into columns: column name → attribute (ferry.telemetry.spans).
LIFTED = {
    "hop": "ferry.hop",
    "operation": "messaging.operation.name",
    "topic": "messaging.destination.name",
    "msg_id": "messaging.message.id",
    "group": "messaging.consumer.group.name",
    "broker": "ferry.broker",
    "outcome": "ferry.outcome",
    "origin_topic": "ferry.origin_topic",
}
NS_PER_MS = 1_000_000
#: The partition value of a span with no destination (a dedup check without scene, ...).
NO_TOPIC = "-"


def _attr(name: str) -> Column:
    return F.col("attributes").getItem(name)


def spans_from_json(text: DataFrame, column: str = "value") -> DataFrame:
    """Rows of span JSON text → one typed row per span (lines that do not parse are dropped)."""
    parsed = text.select(F.from_json(F.col(column), SPAN_JSON_SCHEMA).alias("s")).select("s.*")
    parsed = parsed.where(F.col("span_id").isNotNull() & F.col("start_ns").isNotNull())
    lifted = [_attr(attr).alias(col) for col, attr in LIFTED.items()]
    return parsed.select(
        "trace_id", "span_id", "parent_span_id", "name", "kind", "status", "service",
        *lifted,
        _attr("messaging.destination.partition.id").cast("int").alias("queue_id"),
        _attr("ferry.queue_offset").cast("long").alias("queue_offset"),
        _attr("ferry.reconsume_times").cast("int").alias("reconsume_times"),
        "start_ns", "end_ns",
        F.timestamp_micros((F.col("start_ns") / 1000).cast("long")).alias("start_ts"),
        ((F.col("end_ns") - F.col("start_ns")) / NS_PER_MS).alias("duration_ms"),
        "attributes",
    ).withColumn("topic", F.coalesce(F.col("topic"), F.lit(NO_TOPIC))) \
     .withColumn("day", F.to_date("start_ts"))


def spans_from_dir(spark: SparkSession, trace_dir: str) -> DataFrame | None:
    """The spans of every `*.jsonl` file under `trace_dir`, or None when there is none."""
    files = sorted(str(p) for p in Path(trace_dir).glob("*.jsonl"))
    if not files:
        return None
    return spans_from_json(spark.read.text(files))


def spans_from_topic(spark: SparkSession, namesrv: str) -> DataFrame | None:
    """The spans stored in `%TRACE%`, or None when no broker has written one yet."""
    if not common.topics_with_messages(namesrv, [TRACE_TOPIC]):
        return None
    df = common.read_topic(spark, namesrv, TRACE_TOPIC)
    return spans_from_json(df.select(F.col("body").cast("string").alias("value")))


def load_spans(spark: SparkSession, trace_dir: str | None = None,
               namesrv: str | None = None) -> DataFrame:
    """Spans from the files under `trace_dir` and/or `%TRACE%` at `namesrv`, each once."""
    parts = [df for df in (spans_from_dir(spark, trace_dir) if trace_dir else None,
                           spans_from_topic(spark, namesrv) if namesrv else None)
             if df is not None]
    if not parts:
        return spark.createDataFrame([], empty_spans_schema(spark))
    out = parts[0]
    for more in parts[1:]:
        out = out.unionByName(more)
    return out.dropDuplicates(["span_id", "trace_id"])


def empty_spans_schema(spark: SparkSession) -> T.StructType:
    """The schema of `spans_from_json`'s output (for a run with no span at all)."""
    empty = spark.createDataFrame([], T.StructType([T.StructField("value", T.StringType())]))
    return spans_from_json(empty).schema


def write_spans(spans: DataFrame, out: str, mode: str = "overwrite") -> None:
    """Parquet under `out`, partitioned by `day` and `topic`."""
    spans.write.mode(mode).partitionBy("day", "topic").parquet(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="traces", description=__doc__.split("\n")[0])
    common.add_common_args(parser, trace_dir=True)
    parser.add_argument("--from-topic", action="store_true",
                        help="also read %%TRACE%% through namesrv")   # argparse %-formats help
    parser.add_argument("--out", default=f"{common.DEFAULT_OUT_DIR}/spans")
    args = parser.parse_args(argv)
    with common.job_session("ferry-traces", args.master) as spark:
        spans = load_spans(spark, args.trace_dir or None,
                           args.namesrv if args.from_topic else None).cache()
        write_spans(spans, args.out)
        print(f"traces: {spans.count()} spans -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

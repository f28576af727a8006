"""The report's figures as Spark aggregations over spans (traces.py) and messages (the source).

Latencies are measured from the message's producer `send` span: its start is
the moment the application handed the message over, on the producer's clock.
Every other hop's latency is "since send" = that hop's span end − the send
span's start, so it includes the delay of a delayed message and the back-off
of retries, as a user waits for them. Producers, brokers and consumers on one
machine share a clock; across machines the figures carry the clock skew.
"""
from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

#: Percentiles reported for every latency (p50, p95, p99).
QUANTILES = (0.5, 0.95, 0.99)
#: percentile_approx's accuracy: relative rank error 1/ACCURACY (exact at the test's sizes).
PERCENTILE_ACCURACY = 10_000
NS_PER_MS = 1_000_000
#: The hops a consumer makes for a record of its group (docs/tracing.md).
CONSUMER_HOPS = ("receive", "process", "retry", "dlq")
#: The group column's value for hops that belong to no consumer group.
NO_GROUP = "-"


def _quantiles(col: str, prefix: str = "") -> list[Column]:
    q = F.percentile_approx(col, list(QUANTILES), PERCENTILE_ACCURACY)
    return [q[i].alias(f"{prefix}p{int(p * 100)}_ms") for i, p in enumerate(QUANTILES)]


def message_sends(spans: DataFrame) -> DataFrame:
    """One row per traced message (trace): `trace_id`, `msg_id`, `msg_topic`, `t0_ns`.

    A batch's own span (no message id) is left out; the message's `send`/`create`
    span names its topic (the real one, even for a delayed message).
    """
    sends = spans.where((F.col("hop") == "send") & F.col("msg_id").isNotNull()
                        & (F.col("kind") == "PRODUCER"))
    return sends.groupBy("trace_id").agg(
        F.min("start_ns").alias("t0_ns"),
        F.min_by("msg_id", "start_ns").alias("msg_id"),
        F.min_by("topic", "start_ns").alias("msg_topic"))


def hop_latency(spans: DataFrame, sends: DataFrame) -> DataFrame:
    """Per (topic, group, hop, service): spans, p50/p95/p99 since send and of the span's
    duration. The service tells a hop made on both sides apart (a consumer's `retry` and
    the broker's, around storing the copy)."""
    joined = spans.join(sends.select("trace_id", "t0_ns", "msg_topic"), "trace_id") \
        .withColumn("since_send_ms", (F.col("end_ns") - F.col("t0_ns")) / NS_PER_MS) \
        .withColumn("group", F.coalesce(F.col("group"), F.lit(NO_GROUP)))
    return joined.groupBy(F.col("msg_topic").alias("topic"), "group", "hop", "service").agg(
        F.count("*").alias("spans"), *_quantiles("since_send_ms"),
        *_quantiles("duration_ms", "duration_"))


def _client_side(spans: DataFrame) -> DataFrame:
    """A consumer's own hops (the broker's SERVER `retry`/`dlq` spans are left out)."""
    return spans.where(F.col("hop").isin(*CONSUMER_HOPS) & F.col("group").isNotNull()
                       & (F.col("kind") != "SERVER"))


def deliveries(spans: DataFrame, sends: DataFrame) -> DataFrame:
    """Per (traced message, group): deliveries, retries, the outcome and e2e_ms.

    e2e_ms runs from the send to the end of the group's last hop of that message:
    the successful `process` (or the last `receive` for a pull consumer), or the
    `dlq` send-back of a message given up on.
    """
    mine = _client_side(spans).drop("msg_id").join(sends, "trace_id")
    is_hop = lambda hop: (F.col("hop") == hop).cast("int")  # noqa: E731
    per = mine.groupBy("trace_id", "msg_id", F.col("msg_topic").alias("topic"), "group").agg(
        F.first("t0_ns").alias("t0_ns"),
        F.max("end_ns").alias("done_ns"),
        F.sum(is_hop("receive")).alias("deliveries"),
        F.sum(is_hop("retry")).alias("retries"),
        F.sum(is_hop("dlq")).alias("dead_letters"),
        F.sum(((F.col("hop") == "process") & (F.col("outcome") == "ok")).cast("int"))
        .alias("processed_ok"),
        F.sum(is_hop("process")).alias("processed"))
    outcome = F.when(F.col("dead_letters") > 0, "dead_letter") \
        .when(F.col("processed_ok") > 0, "ok") \
        .when(F.col("processed") > 0, "failed").otherwise("received")
    return per.withColumn("outcome", outcome) \
        .withColumn("e2e_ms", (F.col("done_ns") - F.col("t0_ns")) / NS_PER_MS)


def e2e_latency(per_message: DataFrame) -> DataFrame:
    """Per (topic, group): traced messages, outcomes, retries and e2e p50/p95/p99/max."""
    count_of = lambda o: F.sum((F.col("outcome") == o).cast("int")).alias(o)  # noqa: E731
    return per_message.groupBy("topic", "group").agg(
        F.count("*").alias("messages"), count_of("ok"), count_of("dead_letter"),
        count_of("failed"), count_of("received"),
        F.sum("deliveries").alias("deliveries"), F.sum("retries").alias("retries"),
        *_quantiles("e2e_ms"), F.max("e2e_ms").alias("max_ms"))


def span_settles(spans: DataFrame, sends: DataFrame) -> DataFrame:
    """Per (topic, group): the consumers' `retry` and `dlq` spans (traced messages only;
    the topic is the message's, a send-back's destination being `%RETRY%`/`%DLQ%`)."""
    settles = _client_side(spans).where(F.col("hop").isin("retry", "dlq")) \
        .join(sends.select("trace_id", F.col("msg_topic").alias("msg_topic")), "trace_id")
    return settles.groupBy(F.col("msg_topic").alias("topic"), "group").agg(
        F.sum((F.col("hop") == "retry").cast("int")).alias("retry_spans"),
        F.sum((F.col("hop") == "dlq").cast("int")).alias("dlq_spans"))


def throughput_per_minute(messages: DataFrame) -> DataFrame:
    """Per (topic, minute of store time): messages stored, from the topics themselves."""
    return messages.groupBy("topic", F.date_trunc("minute", "store_ts").alias("minute")) \
        .agg(F.count("*").alias("messages"))


def settled_copies(copies: DataFrame, group: str, column: str) -> DataFrame:
    """Records of a `%RETRY%<group>` / `%DLQ%<group>` read, per origin topic, as `column`.

    Each copy names the topic it failed on in `ORIGIN_TOPIC` (a retry redelivered
    n times is n records of `%RETRY%`).
    """
    origin = F.coalesce(F.col("properties").getItem("ORIGIN_TOPIC"), F.lit("?"))
    return copies.groupBy(origin.alias("topic")).agg(F.count("*").alias(column)) \
        .withColumn("group", F.lit(group))


def produced_positions(messages: DataFrame, bucket_s: int) -> DataFrame:
    """Per (topic, broker, queue, bucket): the queue's end offset (last stored + 1)."""
    bucket = (F.floor(F.unix_micros("store_ts") / (bucket_s * 1_000_000)) * bucket_s)
    return messages.groupBy("topic", "broker", "queue_id", bucket.alias("bucket_s")) \
        .agg((F.max("queue_offset") + 1).alias("end_offset"),
             F.min("queue_offset").alias("first_offset"))


def consumed_positions(spans: DataFrame, bucket_s: int) -> DataFrame:
    """Per (topic, group, broker, queue, bucket): the group's position (last received + 1),
    from first deliveries' `receive` spans (a redelivery's offset is in `%RETRY%`)."""
    first = spans.where((F.col("hop") == "receive") & F.col("group").isNotNull()
                        & (F.coalesce(F.col("reconsume_times"), F.lit(0)) == 0)
                        & F.col("queue_offset").isNotNull())
    bucket = F.floor(F.col("end_ns") / (bucket_s * 1_000_000_000)) * bucket_s
    return first.groupBy("topic", "group", "broker", "queue_id", bucket.alias("bucket_s")) \
        .agg((F.max("queue_offset") + 1).alias("position"))

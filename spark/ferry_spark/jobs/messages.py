"""A topic → Parquet, partitioned by the day messages were stored: `spark/jobs/messages.py`.

Reads through the `ferry` source (every queue, `startingOffsets` → `endingOffsets`,
or a broker's data directory offline with `--option path=...`), keeps the source's
fixed schema and adds `day` (the store day, the partition column). A lake
replay: `--mode append` with `--option startingOffsets=<json>` from the last run.
"""
from __future__ import annotations

import argparse
import sys

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ferry_spark.jobs import common

WRITE_MODES = ("overwrite", "append", "error", "ignore")


def parse_options(pairs: list[str]) -> dict[str, str]:
    """`key=value` strings → the source's options (ValueError naming a bad one)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--option takes key=value, got {pair!r}")
        out[key] = value
    return out


def topic_frame(spark: SparkSession, namesrv: str, topic: str,
                options: dict[str, str] | None = None) -> DataFrame:
    """The topic's messages with `day` (store day) added."""
    return common.read_topic(spark, namesrv, topic, options).withColumn(
        "day", F.to_date("store_ts"))


def export_topic(spark: SparkSession, namesrv: str, topic: str, out: str,
                 options: dict[str, str] | None = None, mode: str = "overwrite") -> int:
    """Write `topic` as Parquet under `out` (partitioned by `day`); returns the row count."""
    if mode not in WRITE_MODES:
        raise ValueError(f"mode must be one of {WRITE_MODES}, got {mode!r}")
    df = topic_frame(spark, namesrv, topic, options).cache()
    try:
        df.write.mode(mode).partitionBy("day").parquet(out)
        return int(df.count())
    finally:
        df.unpersist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="messages", description=__doc__.split("\n")[0])
    common.add_common_args(parser)
    parser.add_argument("topic")
    parser.add_argument("--out", help="default var/spark/messages/<topic>")
    parser.add_argument("--mode", default="overwrite", choices=WRITE_MODES)
    parser.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                        help="a `ferry` source option (startingOffsets, path, ...); repeatable")
    args = parser.parse_args(argv)
    options = parse_options(args.option)
    out = args.out or f"{common.DEFAULT_OUT_DIR}/messages/{args.topic}"
    with common.job_session("ferry-messages", args.master) as spark:
        n = export_topic(spark, args.namesrv, args.topic, out, options, args.mode)
        print(f"messages: {n} rows of {args.topic} -> {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

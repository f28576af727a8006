"""What the jobs share: the session, reading a topic through the `ferry` source, topic lists.

The topic and group lists come from namesrv with `ferry.Admin`, on a short-lived
event loop in the driver: the jobs run on the driver's thread, outside any loop.
"""
from __future__ import annotations

import argparse
import asyncio
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import pandas as pd
from ferry import Admin
from ferry.errors import FerryError
from ferry.names import dlq_topic, retry_topic
from pyspark.sql import DataFrame, SparkSession

#: Where `make up` (deploy/local_mesh.py) serves namesrv when FERRY_NAMESRV is unset.
DEFAULT_NAMESRV = "127.0.0.1:9876"
#: Where `make up` has its processes write JSON-lines spans, relative to the repository.
DEFAULT_TRACE_DIR = "var/traces"
#: Where the jobs write, relative to the repository (`make spark-report`).
DEFAULT_OUT_DIR = "var/spark"


def namesrv_from_env() -> str:
    return os.environ.get("FERRY_NAMESRV", DEFAULT_NAMESRV)


def add_common_args(parser: argparse.ArgumentParser, *, trace_dir: bool = False) -> None:
    """--namesrv, --master: every job has them; --trace-dir the jobs that read spans."""
    parser.add_argument("--namesrv", default=namesrv_from_env(),
                        help="namesrv host:port (default $FERRY_NAMESRV or %(default)s)")
    parser.add_argument("--master", default=os.environ.get("FERRY_SPARK_MASTER", "local[2]"),
                        help="Spark master (default $FERRY_SPARK_MASTER or %(default)s)")
    if trace_dir:
        parser.add_argument("--trace-dir", default=DEFAULT_TRACE_DIR,
                            help="JSON-lines span files (default %(default)s); '' for none")


@contextmanager
def job_session(app_name: str, master: str) -> Iterator[SparkSession]:
    """main()'s session: the active one (spark-submit's, a notebook's, a test's) with the
    `ferry` source registered, else a new one (ferry_spark.session), stopped at the end."""
    from ferry_spark import register, session

    active = SparkSession.getActiveSession()
    if active is not None:
        yield register(active)
        return
    spark = session(app_name=app_name, master=master)
    try:
        yield spark
    finally:
        spark.stop()


def source_url(namesrv: str) -> str:
    """namesrv as the `ferry` source's option takes it (host:port or http://host:port)."""
    return namesrv if "://" in namesrv else f"http://{namesrv}"


def read_topic(spark: SparkSession, namesrv: str, topic: str,
               options: dict[str, str] | None = None) -> DataFrame:
    """A batch read of `topic` (earliest → latest unless `options` say otherwise)."""
    reader = spark.read.format("ferry").option("namesrv", source_url(namesrv)) \
        .option("topic", topic)
    for key, value in (options or {}).items():
        reader = reader.option(key, value)
    return reader.load()


def to_pandas(df: DataFrame) -> pd.DataFrame:
    """`df.toPandas()`, typed (the report's tables are small: a row per topic, group, hop)."""
    return cast(pd.DataFrame, df.toPandas())


def run(coro: Any) -> Any:
    """Run one Admin coroutine from the driver's (loop-less) thread."""
    return asyncio.run(coro)


async def _topics_and_groups(namesrv: str) -> tuple[list[str], list[str]]:
    async with Admin(namesrv=namesrv) as admin:
        topics = [str(t["name"]) for t in await admin.list_topics()]
        groups = [str(g["name"]) for g in await admin.list_groups()]
    return topics, groups


def topics_and_groups(namesrv: str) -> tuple[list[str], list[str]]:
    """Every topic (internal ones too) and every configured group namesrv lists."""
    topics, groups = run(_topics_and_groups(namesrv))
    return list(topics), list(groups)


async def _with_messages(namesrv: str, topics: Sequence[str]) -> list[str]:
    out = []
    async with Admin(namesrv=namesrv) as admin:
        for topic in topics:
            try:
                infos = await admin.queue_infos(topic)
            except FerryError:   # no route: the topic was never written
                continue
            if any(q.max_offset > q.min_offset for q in infos):
                out.append(topic)
    return out


def topics_with_messages(namesrv: str, topics: Sequence[str]) -> list[str]:
    """Those of `topics` that exist and hold a message (an internal topic exists once
    written to; an empty topic is skipped: it adds nothing to a report, and the source
    has no range to plan for it)."""
    return list(run(_with_messages(namesrv, topics)))


def retry_and_dlq_topics(group: str) -> tuple[str, str]:
    return retry_topic(group), dlq_topic(group)

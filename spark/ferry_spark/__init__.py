"""ferry_spark: Ferry for PySpark — the `ferry` data source and the ETL jobs.

    from ferry_spark import session
    spark = session()                      # local[2], "ferry" registered
    df = spark.read.format("ferry").option("namesrv", "127.0.0.1:9876") \\
        .option("topic", "orders").load()

`register(spark)` registers the source on a session built elsewhere;
`SCHEMA` is the fixed schema every read returns. See docs/spark.md.
"""
from __future__ import annotations

import os
import sys
from typing import Any

from pyspark.sql import SparkSession

from ferry_spark.schema import SCHEMA
from ferry_spark.source import NAME, FerryDataSource

#: Session settings `session()` applies unless given: Python workers run this
#: interpreter (not whatever `python3` PATH finds), times are shown in UTC.
SESSION_DEFAULTS = {
    "spark.pyspark.python": sys.executable,
    "spark.pyspark.driver.python": sys.executable,
    "spark.sql.session.timeZone": "UTC",
}


def register(spark: SparkSession) -> SparkSession:
    """Register the "ferry" data source on `spark`; returns `spark`."""
    spark.dataSource.register(FerryDataSource)
    return spark


def session(app_name: str = "ferry", master: str = "local[2]", **conf: Any) -> SparkSession:
    """A Spark session with the "ferry" source registered (conf keys as `spark.x.y`)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name).master(master)
    for key, value in {**SESSION_DEFAULTS, **conf}.items():
        builder = builder.config(key, str(value))
    return register(builder.getOrCreate())


__all__ = ["NAME", "SCHEMA", "FerryDataSource", "register", "session"]

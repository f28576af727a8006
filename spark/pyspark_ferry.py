"""Spark's automatic registration of the `ferry` data source.

PySpark 4 looks, once per session, for top-level modules named `pyspark_*`
on the Python path of its workers and registers each one's `DefaultSource`
(a `pyspark.sql.datasource.DataSource`) under its `name()`. Installing
`ferry-spark` installs this module, so `spark.read.format("ferry")` works in
any session: one's own `SparkSession.builder`, a notebook, `spark-submit`,
without `ferry_spark.session()` or `register()`.
"""
from __future__ import annotations

from ferry_spark.source import FerryDataSource as DefaultSource

__all__ = ["DefaultSource"]

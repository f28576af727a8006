"""The `ferry` PySpark data source: batch and streaming reads and writes of Ferry topics.

`FerryDataSource` only checks options and hands out readers and writers:
`batch` (network or store-directory reads), `stream` (offsets per queue
checkpointed by Spark), `writer` (rows sent as messages with the Producer).
A read's options are checked at `load()`; the topic and namesrv when the query
is planned (its first action, or a stream's start). Each fails with a clear
message there, before any task runs.
"""
from __future__ import annotations

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ferry_spark.schema import SCHEMA
from ferry_spark.source.batch import FerryBatchReader, FerryPushdownReader
from ferry_spark.source.options import read_options, write_options

NAME = "ferry"


class FerryDataSource(DataSource):
    """Registered as "ferry" in every session by `pyspark_ferry` (or `ferry_spark.register`)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType:
        """The fixed schema. Spark asks for it at `load()` of a read (not for writes), so
        the options are checked here already: a bad one fails `load()` itself."""
        read_options(self.options, stream=None)
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        opts = read_options(self.options, stream=False)
        return FerryPushdownReader(opts) if opts.push_down_predicate else FerryBatchReader(opts)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ferry_spark.source.stream import FerryStreamReader
        return FerryStreamReader(read_options(self.options, stream=True))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ferry_spark.source.writer import FerryWriter
        return FerryWriter(write_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ferry_spark.source.writer import FerryStreamWriter
        return FerryStreamWriter(write_options(self.options), schema)


__all__ = ["NAME", "FerryDataSource"]

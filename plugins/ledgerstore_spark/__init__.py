"""Spark connector for ledgerstore: a pyspark Python Data Source named ``ledgerstore``.

>>> df = (spark.read.format("ledgerstore").option("metadata", uri)     # doctest: +SKIP
...       .option("log", "orders").option("password", "s3cret").load())

Spark registers the source by itself once the package is installed (through the top-level module
``pyspark_ledgerstore``); :func:`register` is for sessions whose lookup cannot see it.

Batch reads of a log (``option("log", name)``) or of raw ledgers (``option("ledgers", "1,2,3")``),
streaming reads of a log (offsets are log positions), batch writes and a streaming sink that make
each job's (or micro-batch's) ledgers visible in the log in one compare-and-set. See docs/spark.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ledgerstore_spark.failures import planning
from ledgerstore_spark.options import ConnectorOptions

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = ["LedgerStoreDataSource", "register"]


class LedgerStoreDataSource(DataSource):
    """The ``ledgerstore`` data source. Options (case-insensitive):

    - ``metadata`` (required): the cluster's metadata URI.
    - ``log``: a log name (reads, streaming reads, writes); ``ledgers``: ledger ids "1,2,3" (batch reads).
    - ``password``: the ledgers' password (UTF-8 text).
    - ``partitionSize``: entries per input partition (default 50,000).
    - ``decode``: ``utf8`` or ``json`` adds a ``value`` column (with a user schema, JSON is parsed
      into the ``value`` column's type; otherwise it is the JSON text).
    - streaming reads: ``startingPosition`` (earliest, latest or "ledger:entry"),
      ``maxEntriesPerTrigger``, ``failOnDataLoss`` (default true).
    - writes: ``ensemble``, ``writeQuorum``, ``ackQuorum``, ``digest`` for the new ledgers;
      streaming: ``sinkId`` (stable name of the query) unless the checkpoint is a local path.
    """

    @planning
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.opts = ConnectorOptions.parse(options)

    @classmethod
    def name(cls) -> str:
        return "ledgerstore"

    @planning
    def schema(self) -> StructType:
        from ledgerstore_spark.reading import default_schema

        return default_schema(self.opts)

    @planning
    def reader(self, schema: StructType) -> DataSourceReader:
        from ledgerstore_spark.reading import LedgerStoreBatchReader

        return LedgerStoreBatchReader(self.opts, schema)

    @planning
    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        from ledgerstore_spark.streaming import LedgerStoreStreamReader

        return LedgerStoreStreamReader(self.opts, schema)

    @planning
    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        from ledgerstore_spark.writing import LedgerStoreBatchWriter

        return LedgerStoreBatchWriter(self.opts, schema, overwrite)

    @planning
    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        from ledgerstore_spark.writing import LedgerStoreStreamWriter

        return LedgerStoreStreamWriter(self.opts, schema)


def register(spark: SparkSession) -> None:
    """Make ``format("ledgerstore")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(LedgerStoreDataSource)

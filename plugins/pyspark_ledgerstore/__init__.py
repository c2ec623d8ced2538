"""Spark's automatic registration of the ``ledgerstore`` data source.

Spark 4 looks, once per application, at every installed top-level module whose name starts with
``pyspark_`` and registers its ``DefaultSource`` under ``DefaultSource.name()``. This module is that
hook, so ``spark.read.format("ledgerstore")`` works in any SparkSession without a
``spark.dataSource.register(...)`` call. Keep it tiny: Spark imports it whenever it looks for data
sources, and an import error here would hide every Python data source of the application.
"""

from __future__ import annotations

from ledgerstore_spark import LedgerStoreDataSource as DefaultSource

__all__ = ["DefaultSource"]

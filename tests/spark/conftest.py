"""One local SparkSession for every Spark test: 2 cores, workers on this interpreter, no UI."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest

JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pyspark = pytest.importorskip("pyspark")
    pytest.importorskip("pyarrow")
    if not os.environ.get("JAVA_HOME") and os.path.isdir(JAVA_17):
        os.environ["JAVA_HOME"] = JAVA_17
    # Spark's Python workers must run this interpreter (the one with ledgerstore installed)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    import ledgerstore_spark

    session = (
        SparkSession.builder
        # local[2, 4]: 2 cores, and a failed task is retried (plain local[2] never retries)
        .master("local[2, 4]")
        .appName("ledgerstore-spark-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        # small Arrow batches, so a task that fails mid-partition has already written a ledger
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "1000")
        .config("spark.sql.streaming.stopTimeout", "30s")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    ledgerstore_spark.register(session)
    assert pyspark.__version__
    try:
        yield session
    finally:
        session.stop()

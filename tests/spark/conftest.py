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


@pytest.fixture(autouse=True, scope="module")
def _close_cached_clients() -> Iterator[None]:
    """The connector keeps one client per cluster in each process that uses it, this test process
    (Spark's driver) included: close them after each module, whose clusters are gone by then, so
    the tests that run after it in this process (under pytest-xdist, any file) do not find a
    client of a stopped cluster still open, with its I/O thread and its health checks."""
    yield
    clients = sys.modules.get("ledgerstore_spark.clients")
    if clients is not None:
        clients.close_all()

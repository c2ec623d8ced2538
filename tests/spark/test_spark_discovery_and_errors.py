"""``format("ledgerstore")`` needs no registration call, and a read that cannot start fails with
one message naming the problem, through a real local SparkSession and real bookie processes."""

from __future__ import annotations

import socket
from typing import Any

import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Any:
    c = ledgerstore.Client(metadata=shared_cluster.metadata)
    yield c
    c.close()


@pytest.fixture(scope="module")
def secret_log(client: Any) -> str:
    """A closed log whose ledgers were written with password ``s3cret``."""
    w = client.open_log("secret-log", password=b"s3cret")
    [f.result() for f in [w.append_async(f"s{i}".encode()) for i in range(5)]]
    w.close()
    return "secret-log"


def read_error(spark: Any, **options: str) -> str:
    """The text of the exception a user gets from a batch read with ``options``."""
    r = spark.read.format("ledgerstore")
    for k, v in options.items():
        r = r.option(k, v)
    with pytest.raises(Exception) as info:  # noqa: B017 - Spark's wrapper class is what users get
        r.load().collect()
    return str(info.value)


def assert_plain(text: str, error: str, message: str) -> None:
    """``message`` (raised as ``error``) is near the top, with at most one Python frame above it,
    no chain of the errors it was made from, and no Java stack."""
    lines = text.splitlines()
    hit = next((n for n, line in enumerate(lines) if message in line), None)
    assert hit is not None, text
    assert lines[hit].startswith(f"{error}: "), text
    assert hit <= 4, text  # Spark's heading, "Traceback", one frame and its line, then the message
    assert text.count('File "') <= 1, text
    assert "ledgerstore/client" not in text and "ledgerstore/meta" not in text, text
    assert "During handling" not in text and "direct cause" not in text, text
    assert "at org.apache" not in text, text


def test_a_fresh_session_reads_by_format_name_without_registering(spark: Any, shared_cluster: LocalCluster,
                                                                   client: Any) -> None:
    from pyspark.sql.datasource import DataSource

    class Probe(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ledgerstore_registration_probe"

    spark.dataSource.register(Probe)
    fresh = spark.newSession()
    # registrations made on a session do not reach a new one: only Spark's own lookup can
    with pytest.raises(Exception, match="ledgerstore_registration_probe"):
        fresh.read.format("ledgerstore_registration_probe").load()

    w = client.open_log("unregistered")
    [f.result() for f in [w.append_async(f"u{i}".encode()) for i in range(10)]]
    w.close()
    rows = (fresh.read.format("ledgerstore").option("metadata", shared_cluster.metadata)
            .option("log", "unregistered").option("decode", "utf8").load().collect())
    assert [r.value for r in rows] == [f"u{i}" for i in range(10)]


def test_a_read_without_the_password_of_protected_ledgers_fails_naming_the_option(
        spark: Any, shared_cluster: LocalCluster, secret_log: str) -> None:
    text = read_error(spark, metadata=shared_cluster.metadata, log=secret_log)
    assert_plain(text, "ledgerstore.errors.UnauthorizedAccessError", "has a password and none was given")
    assert "option('password'" in text


def test_a_read_with_a_wrong_password_fails_before_any_task_runs(spark: Any, shared_cluster: LocalCluster,
                                                                  secret_log: str) -> None:
    text = read_error(spark, metadata=shared_cluster.metadata, log=secret_log, password="guess")
    assert_plain(text, "ledgerstore.errors.UnauthorizedAccessError", "option 'password' is not the password")
    assert "s3cret" not in text and "Job aborted" not in text
    rows = (spark.read.format("ledgerstore").option("metadata", shared_cluster.metadata).option("log", secret_log)
            .option("password", "s3cret").load().collect())
    assert len(rows) == 5


def test_a_read_of_an_unknown_log_names_the_log_and_the_logs_there_are(spark: Any, shared_cluster: LocalCluster,
                                                                        secret_log: str) -> None:
    text = read_error(spark, metadata=shared_cluster.metadata, log="no-such-log")
    assert_plain(text, "ledgerstore.errors.LogError", "log 'no-such-log' (option 'log') does not exist")
    assert repr(secret_log) in text


def test_a_read_of_an_unknown_ledger_names_the_ledger(spark: Any, shared_cluster: LocalCluster) -> None:
    text = read_error(spark, metadata=shared_cluster.metadata, ledgers="987654")
    assert_plain(text, "ledgerstore.errors.NoSuchLedgerError", "ledger 987654 does not exist")


def test_a_read_from_an_unreachable_metadata_store_names_the_uri(spark: Any) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    uri = f"etcd://127.0.0.1:{port}/ledgers"
    text = read_error(spark, metadata=uri, log="anything")
    assert_plain(text, "ledgerstore.errors.MetadataError",
                 f"cannot open the ledgerstore metadata store {uri!r} (option 'metadata')")

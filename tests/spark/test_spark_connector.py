"""The ``ledgerstore`` Spark data source against a real local SparkSession and real bookie processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def client(shared_cluster: LocalCluster) -> Any:
    c = ledgerstore.Client(metadata=shared_cluster.metadata)
    yield c
    c.close()


def write_log(client: Any, name: str, payloads: list[bytes], roll_every: int | None = None,
              close: bool = True) -> Any:
    w = client.open_log(name)
    futs = []
    for i, p in enumerate(payloads):
        if roll_every and i and i % roll_every == 0:
            [f.result() for f in futs]
            w.roll()
        futs.append(w.append_async(p))
    [f.result() for f in futs]
    if close:
        w.close()
    return w


def reader(spark: Any, cluster: LocalCluster, **options: str) -> Any:
    r = spark.read.format("ledgerstore").option("metadata", cluster.metadata)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def log_rows(spark: Any, cluster: LocalCluster, name: str) -> list[tuple[int, int, bytes]]:
    t = reader(spark, cluster, log=name).load().select("ledger_id", "entry_id", "payload").toArrow()
    return list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist(), t["payload"].to_pylist(), strict=True))


def test_batch_read_returns_every_entry_of_a_log_in_position_order(spark: Any, shared_cluster: LocalCluster,
                                                                  client: Any) -> None:
    payloads = [f"entry-{i:06d}".encode() for i in range(100_000)]
    write_log(client, "batch100k", payloads, roll_every=40_000)
    df = reader(spark, shared_cluster, log="batch100k", partitionSize="20000").load()
    assert df.schema.simpleString() == "struct<ledger_id:bigint,entry_id:bigint,position:string,payload:binary>"
    assert df.rdd.getNumPartitions() >= 5
    t = df.toArrow()
    assert t.num_rows == 100_000
    assert t["payload"].to_pylist() == payloads
    positions = list(zip(t["ledger_id"].to_pylist(), t["entry_id"].to_pylist(), strict=True))
    assert positions == sorted(positions) and len(set(positions)) == 100_000
    assert len({lid for lid, _ in positions}) == 3
    assert t["position"].to_pylist()[:2] == [f"{positions[0][0]}:0", f"{positions[1][0]}:1"]


def test_read_of_an_open_log_stops_at_the_lac_and_does_not_fence_the_writer(
        spark: Any, shared_cluster: LocalCluster, client: Any) -> None:
    w = client.open_log("openlog")
    for i in range(20):
        w.append(json.dumps({"n": i}).encode())  # one at a time: each add carries the previous LAC
    rows = reader(spark, shared_cluster, log="openlog", decode="json").load().collect()
    lac = client.open_ledger(w.ledger_id, recovery=False).last_add_confirmed
    assert lac >= 0 and [r.entry_id for r in rows] == list(range(lac + 1))
    assert [json.loads(r.value)["n"] for r in rows] == list(range(lac + 1))
    w.append(b"still the leader")  # not fenced by the read
    w.close()
    typed = (spark.read.format("ledgerstore").option("metadata", shared_cluster.metadata).option("log", "openlog")
             .option("decode", "json").schema("entry_id long, value struct<n: int>").load().collect())
    assert [r.value.n if r.value else None for r in typed] == [*range(20), None]


def test_read_of_raw_ledgers_by_id(spark: Any, shared_cluster: LocalCluster, client: Any) -> None:
    ids = []
    for k in range(2):
        lh = client.create_ledger(password=b"pw")
        [f.result() for f in [lh.append_async(f"{k}-{i}".encode()) for i in range(30)]]
        lh.close()
        ids.append(lh.ledger_id)
    rows = reader(spark, shared_cluster, ledgers=f"{ids[1]},{ids[0]}", password="pw", decode="utf8",
                  partitionSize="7").load().collect()
    assert [r.value for r in rows] == [f"1-{i}" for i in range(30)] + [f"0-{i}" for i in range(30)]


def test_available_now_stream_run_twice_reads_each_entry_exactly_once(
        spark: Any, shared_cluster: LocalCluster, client: Any, tmp_path: Path) -> None:
    w = write_log(client, "stream2x", [f"a{i}".encode() for i in range(1500)], roll_every=700, close=False)
    seen: list[str] = []

    def run_once() -> None:
        q = (spark.readStream.format("ledgerstore").option("metadata", shared_cluster.metadata)
             .option("log", "stream2x").option("partitionSize", "400").load()
             .writeStream.foreachBatch(lambda df, _id: seen.extend(r.payload.decode() for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "ckpt")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run_once()
    first = len(seen)
    assert 0 < first <= 1500  # the open ledger is read up to its LAC
    futs = [w.append_async(f"b{i}".encode()) for i in range(800)]
    [f.result() for f in futs]
    w.roll()
    w.append(b"c0")
    w.close()
    run_once()
    expected = [f"a{i}" for i in range(1500)] + [f"b{i}" for i in range(800)] + ["c0"]
    assert seen == expected


def first_attempt_fails(partition: int, after: int, prefix: str) -> Any:
    """A mapPartitions function yielding ``(f"{prefix}-{x:05d}",)`` per row whose first attempt
    of ``partition`` fails after ``after`` rows (Arrow batches of 1000: some are written)."""

    def flaky(rows: Any) -> Any:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        for n, x in enumerate(rows):
            if ctx.partitionId() == partition and ctx.attemptNumber() == 0 and n == after:
                raise RuntimeError(f"injected failure of the first attempt of partition {partition}")
            yield (f"{prefix}-{x:05d}",)

    return flaky


def test_write_job_with_a_retried_task_writes_each_row_exactly_once(
        spark: Any, shared_cluster: LocalCluster, client: Any) -> None:
    before = set(client.list_ledgers())
    flaky = first_attempt_fails(partition=1, after=2500, prefix="row")
    df = spark.sparkContext.parallelize(range(12_000), 3).mapPartitions(flaky).toDF("payload string")
    df.write.format("ledgerstore").option("metadata", shared_cluster.metadata).option("log", "retried") \
        .mode("append").save()
    rows = log_rows(spark, shared_cluster, "retried")
    by_ledger: dict[int, list[bytes]] = {}
    for lid, _, p in rows:
        by_ledger.setdefault(lid, []).append(p)
    # one ledger per partition, each holding exactly that partition's rows, in order
    partitions = [[f"row-{x:05d}".encode() for x in range(k * 4000, (k + 1) * 4000)] for k in range(3)]
    assert sorted(by_ledger.values()) == partitions
    md_ids = sorted(by_ledger)
    # the failed attempt's ledger is gone: only the log's ledgers are new
    new = set(client.list_ledgers()) - before
    assert new == set(md_ids)
    for lid in md_ids:
        assert client.ledger_metadata(lid).is_closed


def test_a_retried_task_attempt_writes_each_partition_sequence_once_as_exactly_once_entries(
        spark: Any, shared_cluster: LocalCluster, client: Any) -> None:
    """A task attempt fails after appending part of its partition (its first Arrow batches are in
    its ledger) and is retried: the log holds each row once, as an entry of producer
    ``spark:<job>:<partition>`` with its row index as its sequence, and a log writer taking the
    log over afterwards knows every partition's last sequence."""

    flaky = first_attempt_fails(partition=0, after=2500, prefix="seq")
    df = spark.sparkContext.parallelize(range(6000), 2).mapPartitions(flaky).toDF("payload string")
    df.write.format("ledgerstore").option("metadata", shared_cluster.metadata).option("log", "sequenced") \
        .mode("append").save()
    records = list(client.open_log_reader("sequenced").records())
    producers = sorted({r.producer_id for r in records})
    assert len(producers) == 2 and all(p.startswith("spark:") for p in producers)
    for k, producer in enumerate(sorted(producers, key=lambda p: int(p.rsplit(":", 1)[1]))):
        mine = [r for r in records if r.producer_id == producer]
        assert [r.seq for r in mine] == list(range(3000))  # each row once, in row order
        assert [r.payload for r in mine] == [f"seq-{x:05d}".encode() for x in range(k * 3000, (k + 1) * 3000)]
    # Spark's own reader hands out the payloads without the entry header
    assert [p for _, _, p in log_rows(spark, shared_cluster, "sequenced")] == [r.payload for r in records]
    w = client.open_log("sequenced")
    assert [w.last_seq_of(p) for p in producers] == [2999, 2999]
    w.close()


def test_failed_write_job_leaves_the_log_unchanged_and_no_orphan_ledgers(
        spark: Any, shared_cluster: LocalCluster, client: Any) -> None:
    write_log(client, "aborted", [b"kept-0", b"kept-1"])
    before_rows = log_rows(spark, shared_cluster, "aborted")
    before = client.list_ledgers()

    def broken(rows: Any) -> Any:
        from pyspark import TaskContext

        for n, x in enumerate(rows):
            if TaskContext.get().partitionId() == 1 and n == 1500:
                raise RuntimeError("injected failure of every attempt of partition 1")
            yield (f"x{x}",)

    df = spark.sparkContext.parallelize(range(6000), 3).mapPartitions(broken).toDF("payload string")
    with pytest.raises(Exception, match="injected failure"):
        df.write.format("ledgerstore").option("metadata", shared_cluster.metadata).option("log", "aborted") \
            .mode("append").save()
    assert log_rows(spark, shared_cluster, "aborted") == before_rows
    assert client.list_ledgers() == before


def test_streaming_sink_commits_each_epoch_once(spark: Any, shared_cluster: LocalCluster, client: Any,
                                                tmp_path: Path) -> None:
    write_log(client, "sink-src", [f"s{i}".encode() for i in range(300)])

    def run_once() -> None:
        q = (spark.readStream.format("ledgerstore").option("metadata", shared_cluster.metadata)
             .option("log", "sink-src").option("partitionSize", "100").load()
             .selectExpr("upper(cast(payload as string)) as payload")
             .writeStream.format("ledgerstore").option("metadata", shared_cluster.metadata)
             .option("log", "sink-dst").option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run_once()
    write_log(client, "sink-src", [f"t{i}".encode() for i in range(200)])
    run_once()
    got = [p for _, _, p in log_rows(spark, shared_cluster, "sink-dst")]
    # every row once; the second run's epoch follows the first's
    assert sorted(got[:300]) == sorted(f"S{i}".encode() for i in range(300))
    assert sorted(got[300:]) == sorted(f"T{i}".encode() for i in range(200))


def test_a_repeated_epoch_commit_is_skipped_and_its_ledgers_deleted(shared_cluster: LocalCluster,
                                                                     client: Any) -> None:
    from pyspark.sql.types import StringType, StructField, StructType

    from ledgerstore_spark import LedgerStoreDataSource

    schema = StructType([StructField("payload", StringType())])
    source = LedgerStoreDataSource({"metadata": shared_cluster.metadata, "log": "epochs", "sinkId": "q1"})

    def attempt(rows: list[str]) -> Any:
        writer = source.streamWriter(schema, False)  # Spark builds a fresh writer for every commit
        batch = pa.RecordBatch.from_arrays([pa.array(rows, pa.string())], names=["payload"])
        return writer, [writer.write(iter([batch]))]

    w, msgs = attempt(["e0-a", "e0-b"])
    w.commit(msgs, 0)
    w, again = attempt(["e0-a", "e0-b"])  # the driver died after committing epoch 0: Spark replays it
    w.commit(again, 0)
    assert again[0].ledger_id not in client.list_ledgers()
    w, msgs = attempt(["e1-a"])
    w.commit(msgs, 1)
    rh = client.open_log_reader("epochs")
    assert [p for _, p in rh] == [b"e0-a", b"e0-b", b"e1-a"]


def test_example_pipeline_runs_against_a_cluster(shared_cluster: LocalCluster, tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "spark_pipeline.py"), shared_cluster.metadata,
                          "--seed", "500", "--checkpoint", str(tmp_path / "ckpt")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    summary = json.loads(out.stdout.strip().splitlines()[-1])
    assert summary["batch_written"] == summary["expected"] > 0
    assert summary["stream_written"] == summary["expected"]


def test_a_commit_fences_an_open_ledger_anywhere_in_the_log(shared_cluster: LocalCluster, client: Any) -> None:
    """A writer of an older release could roll past a ledger it failed to close. The commit acts as the
    log's leader, so it recovers every ledger of the list that is not closed, not only the last two:
    the stale writer is fenced and the entries it had acknowledged are kept."""
    from ledgerstore.errors import LedgerFencedError
    from ledgerstore_spark.logmeta import append_ledgers, get_or_create_log
    from ledgerstore_spark.options import ConnectorOptions
    from ledgerstore_spark.writing import commit_to_log

    stale = client.create_ledger(password=b"")
    for i in range(5):
        stale.append(f"stale-{i}".encode())
    closed = []
    for name in ("b", "c", "d"):
        lh = client.create_ledger(password=b"")
        lh.append(name.encode())
        lh.close()
        closed.append(lh.ledger_id)
    md = append_ledgers(client, get_or_create_log(client, "open-in-the-middle"), [stale.ledger_id, *closed])
    job = client.create_ledger(password=b"")
    job.append(b"job")
    job.close()
    opts = ConnectorOptions.parse({"metadata": shared_cluster.metadata, "log": "open-in-the-middle"})
    md = commit_to_log(client, opts, "open-in-the-middle", [job.ledger_id])
    assert md is not None and md.ledger_ids[-1] == job.ledger_id
    lmd = client.ledger_metadata(stale.ledger_id)
    assert lmd.is_closed and lmd.last_entry_id == 4
    with pytest.raises(LedgerFencedError):
        stale.append(b"after the commit")
    rh = client.open_log_reader("open-in-the-middle")
    assert [p for _, p in rh] == [*(f"stale-{i}".encode() for i in range(5)), b"b", b"c", b"d", b"job"]

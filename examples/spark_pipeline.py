"""A Spark pipeline over ledgerstore logs: read a log of JSON orders, keep the large ones, write
them to another log, once as a batch job and once as an incremental streaming job.

Start a cluster, then run this with the metadata URI it prints::

    ledgerstore standalone --data-dir /tmp/ls &        # prints "metadata URI: sqlite:///tmp/ls/metadata.db"
    python examples/spark_pipeline.py sqlite:///tmp/ls/metadata.db

The source log ``orders`` is filled with ``--seed`` sample orders if it does not exist yet. The last
line printed is a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile

import ledgerstore

JAVA_17 = "/usr/lib/jvm/java-17-openjdk-amd64"
THRESHOLD = 50.0


def seed_orders(client: ledgerstore.Client, log: str, n: int) -> None:
    """Write ``n`` sample orders (JSON) to ``log``."""
    rng = random.Random(7)
    with client.open_log(log) as writer:
        futures = [writer.append_async(json.dumps({"id": i, "customer": f"c{rng.randrange(100)}",
                                                   "amount": round(rng.uniform(1, 100), 2)}).encode())
                   for i in range(n)]
        for f in futures:
            f.result()


def count_large(client: ledgerstore.Client, log: str) -> int:
    """Orders at or above the threshold, counted with the plain client (to check Spark's result)."""
    with client.open_log_reader(log) as reader:
        return sum(1 for _, payload in reader if json.loads(payload)["amount"] >= THRESHOLD)


def log_length(client: ledgerstore.Client, log: str) -> int:
    if log not in client.list_logs():
        return 0
    with client.open_log_reader(log) as reader:
        return sum(1 for _ in reader)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("metadata", help="the cluster's metadata URI, e.g. sqlite:///tmp/ls/metadata.db")
    ap.add_argument("--source", default="orders")
    ap.add_argument("--dest", default="large-orders")
    ap.add_argument("--stream-dest", default="large-orders-stream")
    ap.add_argument("--seed", type=int, default=10_000, help="orders to write if the source log does not exist")
    ap.add_argument("--checkpoint", default=None, help="checkpoint directory of the streaming job")
    args = ap.parse_args()

    os.environ.setdefault("JAVA_HOME", JAVA_17)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need ledgerstore_spark importable
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import ledgerstore_spark

    client = ledgerstore.Client(metadata=args.metadata)
    if args.source not in client.list_logs():
        seed_orders(client, args.source, args.seed)
    expected = count_large(client, args.source)
    before_batch = log_length(client, args.dest)
    before_stream = log_length(client, args.stream_dest)

    spark = (SparkSession.builder.master("local[2]").appName("ledgerstore-pipeline")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ledgerstore_spark.register(spark)

    def large_orders(df):  # the transformation, shared by the batch and the streaming job
        return (df.where(F.col("value.amount") >= THRESHOLD)
                .select(F.to_json(F.struct("value.id", "value.customer", "value.amount", "position"))
                        .alias("payload")))

    schema = "position string, value struct<id: long, customer: string, amount: double>"

    # batch: the whole source log, one job, committed to the destination log in one step
    orders = (spark.read.format("ledgerstore").option("metadata", args.metadata).option("log", args.source)
              .option("decode", "json").schema(schema).load())
    (large_orders(orders).write.format("ledgerstore").option("metadata", args.metadata)
     .option("log", args.dest).mode("append").save())

    # streaming: the same transformation, incrementally; run it again later to pick up new orders
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="ledgerstore-pipeline-")
    query = (spark.readStream.format("ledgerstore").option("metadata", args.metadata).option("log", args.source)
             .option("decode", "json").schema(schema).load()
             .transform(large_orders)
             .writeStream.format("ledgerstore").option("metadata", args.metadata).option("log", args.stream_dest)
             .option("checkpointLocation", checkpoint).trigger(availableNow=True).start())
    query.awaitTermination()

    summary = {"expected": expected,
               "batch_written": log_length(client, args.dest) - before_batch,
               "stream_written": log_length(client, args.stream_dest) - before_stream}
    spark.stop()
    client.close()
    print(json.dumps(summary))
    if summary["batch_written"] != expected or summary["stream_written"] != expected:
        sys.exit(1)


if __name__ == "__main__":
    main()

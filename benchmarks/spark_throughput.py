"""Spark connector throughput: rows/s of a batch write to a log and a batch read of it back.

Starts a local cluster of 3 bookie processes (or uses ``--metadata``), then with a local
SparkSession of ``--cores`` cores writes ``--rows`` rows of ``--size``-byte payloads with
``df.write.format("ledgerstore")`` and reads them back with ``spark.read.format("ledgerstore")``::

    JAVA_HOME=/usr/lib/jvm/java-17-openjdk-amd64 .venv/bin/python benchmarks/spark_throughput.py --rows 200000

Prints one JSON line with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--metadata", help="an existing cluster's metadata URI (default: start 3 local bookies)")
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=1024, help="payload bytes per row")
    ap.add_argument("--cores", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4, help="write tasks")
    ap.add_argument("--partition-size", type=int, default=50_000, help="entries per read partition")
    args = ap.parse_args()

    os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F

    import ledgerstore_spark
    from ledgerstore.cluster import LocalCluster

    cluster = None
    metadata = args.metadata
    if metadata is None:
        cluster = LocalCluster(Path(tempfile.mkdtemp(prefix="ls-spark-bench-")), 3, port_base=None)
        cluster.start()
        metadata = cluster.metadata
    spark = (SparkSession.builder.master(f"local[{args.cores}]").appName("ledgerstore-spark-bench")
             .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", str(args.cores))
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    ledgerstore_spark.register(spark)
    log = f"bench-{int(time.time())}"
    try:
        filler = "x" * (args.size - 12)
        df = (spark.range(0, args.rows, numPartitions=args.partitions)
              .select(F.encode(F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit(filler)), "utf-8")
                      .alias("payload")))
        t0 = time.perf_counter()
        df.write.format("ledgerstore").option("metadata", metadata).option("log", log).mode("append").save()
        write_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        got = (spark.read.format("ledgerstore").option("metadata", metadata).option("log", log)
               .option("partitionSize", str(args.partition_size)).load()
               .agg(F.count("*").alias("n"), F.sum(F.length("payload")).alias("bytes")).collect()[0])
        read_s = time.perf_counter() - t0
        assert got["n"] == args.rows and got["bytes"] == args.rows * args.size, got
        print(json.dumps({"rows": args.rows, "payload_bytes": args.size, "cores": args.cores,
                          "write_s": round(write_s, 2), "write_rows_per_s": round(args.rows / write_s),
                          "write_mb_per_s": round(args.rows * args.size / write_s / 1e6, 1),
                          "read_s": round(read_s, 2), "read_rows_per_s": round(args.rows / read_s),
                          "read_mb_per_s": round(args.rows * args.size / read_s / 1e6, 1)}))
    finally:
        spark.stop()
        if cluster is not None:
            cluster.stop()


if __name__ == "__main__":
    main()

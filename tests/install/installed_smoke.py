"""Run by ``test_wheel.py`` with the interpreter of a fresh virtualenv that has only the built
wheel installed: what a user does first, checked from the installed package, not the checkout.

    python installed_smoke.py METADATA_URI {compiled|pure} [--spark]

Checks that ``ledgerstore`` comes from the virtualenv, that the expected hot path runs (for
``compiled``: all three extension modules are loaded from the virtualenv and in use), writes a
ledger with a client and reads it back verified, and with ``--spark`` reads the same ledger with
``spark.read.format("ledgerstore")`` in a new SparkSession, with no registration call. Prints one
``smoke ok`` line; any failure is an exception and a non-zero exit.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ENTRIES = 500
PASSWORD = "smoke"


def check_hot_path(mode: str) -> str:
    import ledgerstore
    from ledgerstore.client import adds
    from ledgerstore.proto import speedups
    from ledgerstore_entrylog import format as entrylog_format

    prefix = Path(sys.prefix).resolve()
    assert prefix in Path(ledgerstore.__file__).resolve().parents, f"ledgerstore imported from {ledgerstore.__file__}"
    if mode == "pure":
        assert not speedups.state.compiled and speedups.compiled is None, speedups.state
        assert not adds.compiled_available() and entrylog_format.append_run() is None
        return str(speedups.state)
    assert speedups.state.compiled, speedups.state
    import ledgerstore.client._adds
    import ledgerstore.proto._speedups
    import ledgerstore_entrylog._records

    for module in (ledgerstore.proto._speedups, ledgerstore.client._adds, ledgerstore_entrylog._records):
        path = Path(module.__file__ or "").resolve()
        assert path.suffix == ".so" and prefix in path.parents, f"{module.__name__} loaded from {path}"
    assert speedups.compiled is ledgerstore.proto._speedups
    assert adds.implementation()[0] is ledgerstore.client._adds.PendingAdd
    assert entrylog_format.append_run() is not None and entrylog_format.cut_records() is not None
    return str(speedups.state)


def write_and_read(metadata: str) -> tuple[int, list[str]]:
    import ledgerstore

    payloads = [f"entry-{i}" for i in range(ENTRIES)]
    with ledgerstore.Client(metadata=metadata) as client:
        lh = client.create_ledger(ensemble=3, write_quorum=3, ack_quorum=2, digest="crc32c",
                                  password=PASSWORD.encode())
        futures = [lh.append_async(p.encode()) for p in payloads]
        assert [f.result(timeout=60) for f in futures] == list(range(ENTRIES))
        lh.close()
        rh = client.open_ledger(lh.ledger_id, password=PASSWORD.encode())
        got = [e.payload.decode() for e in rh.read(0, rh.last_add_confirmed)]
        assert got == payloads, "read back other entries than were written"
        return lh.ledger_id, payloads


def spark_read(metadata: str, ledger_id: int, payloads: list[str]) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").appName("ledgerstore-installed-smoke")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "1g").getOrCreate())
    try:
        spark.sparkContext.setLogLevel("ERROR")
        rows = (spark.read.format("ledgerstore").option("metadata", metadata).option("ledgers", str(ledger_id))
                .option("password", PASSWORD).option("decode", "utf8").load().collect())
        assert sorted((r.entry_id, r.value) for r in rows) == list(enumerate(payloads)), rows[:5]
    finally:
        spark.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("metadata")
    parser.add_argument("mode", choices=["compiled", "pure"])
    parser.add_argument("--spark", action="store_true")
    args = parser.parse_args()
    state = check_hot_path(args.mode)
    ledger_id, payloads = write_and_read(args.metadata)
    if args.spark:
        spark_read(args.metadata, ledger_id, payloads)
    print(f"smoke ok: hot path {state}; ledger {ledger_id}: {len(payloads)} entries written and read back"
          + (", and through Spark" if args.spark else ""), flush=True)


if __name__ == "__main__":
    main()

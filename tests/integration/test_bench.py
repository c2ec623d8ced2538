"""``ledgerstore bench`` end to end: on its own local cluster and against an existing one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ledgerstore
from ledgerstore.cluster import LocalCluster
from ledgerstore.meta.ledgers import LedgerState


def bench(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "bench", *args], capture_output=True, text=True,
                         timeout=300)
    if check and out.returncode != 0:
        raise AssertionError(f"ledgerstore bench {' '.join(args)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}")
    return out


def test_bench_writes_on_its_own_cluster_reports_throughput_latency_and_plots(tmp_path: Path) -> None:
    png = tmp_path / "writes.png"
    data = json.loads(bench("writes", "--count", "2000", "--entry-size", "100", "-e", "3", "-w", "3", "-a", "2",
                            "--json", "--plot", str(png)).stdout)
    assert data["mode"] == "writes" and data["entries"] == 2000 and data["errors"] == 0
    assert data["bytes"] == 2000 * 100
    assert data["entries_per_s"] > 0 and data["mb_per_s"] > 0 and data["seconds"] > 0
    lat = data["latency_ms"]
    assert 0 < lat["min"] <= lat["p50"] <= lat["p95"] <= lat["p99"] <= lat["p99.9"] <= lat["max"]
    assert sum(data["per_second"]) == 2000
    assert data["cluster"].startswith("local cluster of 3 bookies")
    assert data["plot"] == str(png)
    head = png.read_bytes()[:8]
    assert head == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_bench_reads_on_its_own_cluster() -> None:
    out = bench("reads", "--count", "3000", "--entry-size", "200", "--batch", "500")
    assert "bench reads: 3,000 entries" in out.stdout and "entries/s" in out.stdout


def test_bench_writes_round_robin_and_reads_an_existing_ledger(shared_cluster: LocalCluster) -> None:
    data = json.loads(bench("writes", "--metadata", shared_cluster.metadata, "--count", "900", "--ledgers", "3",
                            "--throttle", "50", "--keep-ledgers", "--json").stdout)
    assert data["entries"] == 900 and len(data["ledger_ids"]) == 3 and data["options"]["throttle"] == 50
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        for lid in data["ledger_ids"]:
            md = client.ledger_metadata(lid)
            assert md.state is LedgerState.CLOSED and md.last_entry_id == 299  # 900 adds over 3 ledgers

        lh = client.create_ledger(3, 2, 2, password=b"pw")
        for i in range(250):
            lh.append(b"entry-%04d" % i)
        lh.close()
    read = json.loads(bench("reads", "--metadata", shared_cluster.metadata, "--ledger-id", str(lh.ledger_id),
                            "--password", "pw", "--batch", "100", "--json").stdout)
    assert read["ledger_id"] == lh.ledger_id and read["entries"] == 250 and read["bytes"] == 250 * 10
    assert read["written_first"] is False and read["entries_per_s"] > 0
    # the ledger read was an existing one: it is left in place
    with ledgerstore.Client(metadata=shared_cluster.metadata) as client:
        assert lh.ledger_id in client.list_ledgers()
    wrong = bench("reads", "--metadata", shared_cluster.metadata, "--ledger-id", str(lh.ledger_id),
                  "--password", "nope", check=False)
    assert wrong.returncode == 1 and "UnauthorizedAccessError" in wrong.stderr


@pytest.mark.parametrize("args, message", [
    (["writes", "-e", "2", "-w", "3", "--count", "10"], "ensemble >= write quorum"),
    (["writes", "--bookies", "2", "--count", "10"], "fewer than the ensemble size"),
    (["reads", "--ledger-id", "7"], "--ledger-id needs --metadata"),
])
def test_bench_refuses_bad_options_before_starting_anything(args: list[str], message: str) -> None:
    out = bench(*args, check=False)
    assert out.returncode != 0 and message in out.stderr

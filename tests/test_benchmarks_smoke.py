"""Smoke test of ``benchmarks/run_all.py``: a tiny run against real bookie processes (and a real
redis-server when installed) must write a JSON result and a Markdown table of the documented
shape. It checks the shape and the pass/fail arithmetic, never the timings."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import background
from tests.conftest import BENCH_TINY_OUT

ROOT = Path(__file__).resolve().parents[1]
RUN_ALL = ROOT / "benchmarks" / "run_all.py"
ROW_KEYS = ["write_100b_e3", "write_1kb_e3", "write_100b_e1", "latency_10k", "read_seq_100b", "vs_redis",
            "catchup_isolation", "recovery", "gc_reclaim", "many_ledgers", "metadata_scale", "log_dedup"]


def _has_redis() -> bool:
    try:
        import redis  # noqa: F401
    except ImportError:
        return False
    return shutil.which("redis-server") is not None


@pytest.fixture(scope="module")
def tiny_run() -> tuple[dict, str, str]:
    """``run_all.py --tiny`` (tests/conftest.py, tests/background.py)."""
    proc = background.result("bench-tiny")
    assert proc.returncode == 0, f"run_all.py --tiny failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads((BENCH_TINY_OUT / "r.json").read_text()), (BENCH_TINY_OUT / "r.md").read_text(), proc.stdout


def test_json_result_has_every_target_row_with_a_verdict(tiny_run: tuple[dict, str, str]) -> None:
    result, _, _ = tiny_run
    rows = {r["key"]: r for r in result["rows"]}
    assert list(rows) == ROW_KEYS
    for key, r in rows.items():
        assert r["op"] in (">=", "<=") and r["target"] > 0, key
        assert "load average" in r["load_before"], key
        if r["skipped"] is not None:
            assert key == "vs_redis" and not _has_redis() and r["status"] == "skipped"
            continue
        assert isinstance(r["measured"], int | float) and r["measured"] > 0, key
        expect = r["measured"] >= r["target"] if r["op"] == ">=" else r["measured"] <= r["target"]
        # a row with further targets (benchmarks/ops_rows.py) passes only when they are met too
        expect = expect and all(r["details"].get("other_targets", {}).values())
        assert r["passed"] is expect and r["status"] == ("pass" if expect else "FAIL"), key
    assert rows["write_100b_e3"]["details"]["entries"] == 2000
    assert rows["read_seq_100b"]["details"]["entries"] == rows["write_100b_e3"]["details"]["entries"]
    assert rows["latency_10k"]["details"]["errors"] == 0
    assert set(rows["latency_10k"]["details"]["latency_ms"]) >= {"p50", "p99", "p99.9"}
    if _has_redis():
        red = rows["vs_redis"]["details"]["redis"]
        assert red["settings"] == {"appendonly": "yes", "appendfsync": "always", "save": ""}
        assert red["entries"] == 2000
        assert rows["vs_redis"]["measured"] == round(rows["write_100b_e3"]["measured"] / red["entries_per_s"], 2)


def test_json_result_has_the_memory_figures(tiny_run: tuple[dict, str, str]) -> None:
    result, _, _ = tiny_run
    client = result["client_memory"]
    assert client["outstanding"] == 2000  # every add stayed outstanding while the bookies were paused
    assert client["rss_with_outstanding_mb"] > 0 and client["python_heap_bytes_per_add"] > 0
    bookie = result["bookie_memory"]
    assert bookie["entries_on_bookie"] == 2000 + 5000
    assert bookie["rss_mb_end"] > 0 and len(bookie["samples"]) >= 2
    assert result["machine"]["cpus"] >= 1


def test_markdown_table_lists_every_row_with_measured_target_and_result(tiny_run: tuple[dict, str, str]) -> None:
    result, md, stdout = tiny_run
    lines = md.splitlines()
    header = lines.index("| Benchmark | Metric | Measured | Target | Result | Load before (1/5/15 min) |")
    table = lines[header + 2:header + 2 + len(ROW_KEYS)]
    for line, r in zip(table, result["rows"], strict=True):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == r["name"] and cells[4] == r["status"]
        assert cells[3].startswith(r["op"])
    assert "## Memory" in md
    assert "wrote " in stdout


def test_repeat_and_only_report_the_spread_of_each_row_and_attribute_the_latency_stalls(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN_ALL), "--tiny", "--only", "latency", "--repeat", "2",
         "--json-out", str(tmp_path / "r.json"), "--md-out", str(tmp_path / "r.md")],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, f"run_all.py --repeat 2 failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads((tmp_path / "r.json").read_text())
    rows = {r["key"]: r for r in result["rows"]}
    assert list(rows) == ROW_KEYS and result["repeat"] == 2 and len(result["runs"]) == 2
    for key, r in rows.items():
        if key != "latency_10k":
            assert r["skipped"] == "not run (--only)" and r["status"] == "skipped", key
    lat = rows["latency_10k"]
    per_run = [next(r for r in run["rows"] if r["key"] == "latency_10k")["measured"] for run in result["runs"]]
    spread = lat["spread"]
    assert spread["values"] == per_run and spread["runs"] == 2
    assert spread["min"] == min(per_run) and spread["max"] == max(per_run) and lat["measured"] == spread["median"]
    assert lat["passed"] is (spread["passed_runs"] == 2)
    # every bookie served its per-second peaks, and the client probed its own loop
    for run in result["runs"]:
        stalls = next(r for r in run["rows"] if r["key"] == "latency_10k")["details"]["stalls"]
        assert stalls["worst_seconds"] and all("peaks_ms" in w and w["runnable"] >= 1 for w in stalls["worst_seconds"])
        procs = {name.split(".")[0] for name in stalls["run_peaks_ms"]}
        assert {"bookie0", "bookie1", "bookie2"} <= procs, stalls["run_peaks_ms"]
    md = (tmp_path / "r.md").read_text()
    assert "| Benchmark | Metric | Min / median / max | Target | Runs passing | Result |" in md
    assert "the worst seconds and what the processes were doing" in md
    assert "of 2 runs pass" in proc.stdout


def test_only_runs_the_rows_a_chosen_row_needs(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(RUN_ALL), "--tiny", "--only", "read_seq_100b",
         "--json-out", str(tmp_path / "r.json"), "--md-out", str(tmp_path / "r.md")],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, f"run_all.py --only read_seq_100b failed:\n{proc.stdout}\n{proc.stderr}"
    rows = {r["key"]: r for r in json.loads((tmp_path / "r.json").read_text())["rows"]}
    # the read row reads the ledger the 100 B row writes: both ran, nothing else did
    assert {k for k, r in rows.items() if r["skipped"] is None} == {"write_100b_e3", "read_seq_100b"}
    assert rows["read_seq_100b"]["details"]["entries"] == rows["write_100b_e3"]["details"]["entries"] == 2000


def test_the_client_add_path_benchmark_reports_every_mode_on_both_paths() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "client_add_path.py"), "--adds", "20000",
                           "--runs", "1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("µs per add, 20,000 adds")
    modes = ("library only", "a done-callback per add", "awaited in order (run_writes)")
    for path in ("pure Python",) + (("compiled",) if "not built" not in proc.stdout else ()):
        for mode in modes:
            assert any(line.strip().startswith(path) and mode in line for line in lines), (path, mode, lines)

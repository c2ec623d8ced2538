"""Start-up failures through the real command line: one line, a non-zero exit, no traceback and no
cookie left behind; the standalone supervises its bookies as one program."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ledgerstore.cluster import free_ports

CLI = [sys.executable, "-m", "ledgerstore"]


def run_cli(*args: str, timeout: float = 60.0, **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, **kw)  # type: ignore[call-overload, no-any-return]


def one_line_failure(proc: subprocess.CompletedProcess[str]) -> str:
    """Assert the command failed with exactly one line on stderr and no traceback; return it."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    return lines[0]


def read_until_ready(proc: subprocess.Popen[str], seen: list[str]) -> None:
    """Read a bookie's output into ``seen`` until it says it is ready; fail with it if it exits."""
    assert proc.stdout is not None
    while not seen or " ready" not in seen[-1]:
        line = proc.stdout.readline()
        if not line:
            pytest.fail("bookie exited before it was ready:\n" + "".join(seen))
        seen.append(line)


def bookie_config(tmp: Path, *, metadata: str | None = None, port: int | None = None, extra: str = "",
                  journal_dir: str = "journal") -> Path:
    cfg = tmp / "bookie.toml"
    # one bookie and no metadata server: these tests ask for sqlite's direct mode
    direct = 'metadata_options = { server = "never" }\n' if metadata is None and "metadata_options" not in extra else ""
    cfg.write_text(
        "[bookie]\n"
        f'metadata = "{metadata or "sqlite://" + str(tmp / "meta.db")}"\n'
        f'listen = "tcp://127.0.0.1:{port if port is not None else free_ports(1)[0]}"\n'
        f'journal_dir = "{journal_dir}"\n'
        'ledger_dirs = ["ledgers"]\n'
        "auto_init_cluster = true\n" + direct + extra  # a fresh store holds no cluster; these tests are about other steps
    )
    return cfg


def cookies_anywhere(tmp: Path) -> list[str]:
    """Cookie files under ``tmp`` and cookie keys in its sqlite metadata store."""
    found = [str(p) for p in tmp.rglob("COOKIE")]
    db = tmp / "meta.db"
    if db.exists():
        from ledgerstore.meta import layout
        from ledgerstore.plugins import create_metadata_store

        async def keys() -> list[str]:
            store = create_metadata_store(f"sqlite://{db}")
            await store.start()
            try:
                return await store.children(layout.COOKIES)
            finally:
                await store.close()

        found += asyncio.run(keys())
    return found


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s
    s.close()


def test_a_bookie_on_a_port_in_use_fails_in_one_line_naming_the_holder_and_writes_no_cookie(
        tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    line = one_line_failure(run_cli("bookie", "--config", str(bookie_config(tmp_path, port=port))))
    assert f"port {port} is already in use by pid {os.getpid()}" in line
    assert cookies_anywhere(tmp_path) == []


def test_a_bookie_whose_admin_port_is_taken_fails_before_writing_a_cookie(
        tmp_path: Path, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    cfg = bookie_config(tmp_path, extra=f"http_port = {port}\n")
    line = one_line_failure(run_cli("bookie", "--config", str(cfg)))
    assert "http_port" in line and f"port {port} is already in use" in line
    assert cookies_anywhere(tmp_path) == []


def test_a_bookie_whose_journal_dir_is_a_file_fails_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "journal").write_text("not a directory")
    line = one_line_failure(run_cli("bookie", "--config", str(bookie_config(tmp_path))))
    assert "journal_dir" in line and "is a file, not a directory" in line
    assert cookies_anywhere(tmp_path) == []


def test_a_bookie_whose_ledger_dir_is_not_writable_fails_in_one_line(tmp_path: Path) -> None:
    cfg = bookie_config(tmp_path)
    if os.geteuid() == 0:  # root writes anywhere it has a mode for; sysfs refuses even root
        unwritable = "/sys/fs"
        cfg.write_text(cfg.read_text().replace('ledger_dirs = ["ledgers"]', f'ledger_dirs = ["{unwritable}"]'))
    else:
        unwritable = str(tmp_path / "ledgers")
        Path(unwritable).mkdir(mode=0o555)
    line = one_line_failure(run_cli("bookie", "--config", str(cfg)))
    assert f"ledger_dirs {unwritable} is not writable" in line
    assert cookies_anywhere(tmp_path) == []


@pytest.mark.parametrize("scheme", ["zk", "etcd"])
def test_an_unreachable_metadata_store_is_one_line_not_the_client_library_reconnect_log(
        tmp_path: Path, scheme: str) -> None:
    closed = free_ports(1)[0]
    waits = "session_timeout = 2\n" + ("connect_timeout = 2\n" if scheme == "zk" else "")  # not kazoo's 15 s
    cfg = bookie_config(tmp_path, metadata=f"{scheme}://127.0.0.1:{closed}/ledgers",
                        extra="metadata_start_retry_s = 0\n[bookie.metadata_options]\n" + waits)
    line = one_line_failure(run_cli("bookie", "--config", str(cfg), timeout=120))
    assert f"metadata store {scheme}://127.0.0.1:{closed}/ledgers is unavailable" in line
    assert cookies_anywhere(tmp_path) == []


def test_a_metadata_store_locked_at_start_is_retried_until_it_frees(tmp_path: Path) -> None:
    """sqlite's "database is locked" (other bookies compacting) is waited out, not an exit 1."""
    db = tmp_path / "meta.db"
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS hold (x)")
    holder.execute("BEGIN EXCLUSIVE")
    cfg = bookie_config(tmp_path, extra="metadata_start_retry_s = 60\n"  # direct mode: the file itself is locked
                                        "[bookie.metadata_options]\nbusy_timeout = 0.05\nserver = \"never\"\n")
    proc = subprocess.Popen([*CLI, "bookie", "--config", str(cfg)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:  # the bookie says it waits, and only then is the lock released
            seen.append(line)
            if "unavailable" in line and "retrying" in line:
                break
        else:
            pytest.fail("bookie exited instead of retrying:\n" + "".join(seen))
        holder.execute("ROLLBACK")
        read_until_ready(proc, seen)
    finally:
        holder.close()
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)


def test_an_out_of_range_port_fails_alike_in_config_check_and_at_start(tmp_path: Path) -> None:
    cfg = bookie_config(tmp_path, port=99999)
    checked = run_cli("config", "check", str(cfg))
    started = run_cli("bookie", "--config", str(cfg))
    for proc in (checked, started):
        assert proc.returncode == 2, proc.stderr
        assert "port 99999 is not between 0 and 65535" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert cookies_anywhere(tmp_path) == []


def test_config_check_validates_plugin_names_and_plugin_options(tmp_path: Path) -> None:
    cfg = bookie_config(tmp_path, metadata="sqlit:///x.db", extra=(
        'storage = "rocksdb"\n[bookie.storage_options]\nno_such_option = 1\n'))
    proc = run_cli("config", "check", str(cfg))
    assert proc.returncode == 2
    assert "no metadata backend named 'sqlit'" in proc.stderr
    assert "no_such_option" in proc.stderr


def test_an_install_hint_keeps_the_extra_on_the_command_line() -> None:
    code = ("from ledgerstore.cli.common import handle_errors\n"
            "from ledgerstore.plugins import load_driver\n"
            "from ledgerstore import plugins\n"
            "plugins.EXTRAS[('storage', 'not-installed')] = 'rocksdb'\n"
            "handle_errors(lambda: load_driver('storage', 'not-installed'))()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, COLUMNS="500"))
    line = one_line_failure(proc)
    assert "pip install '/path/to/ledgerstore[rocksdb]'" in line


def test_a_standalone_with_zero_bookies_is_an_error_not_a_cluster(tmp_path: Path) -> None:
    proc = run_cli("standalone", "--bookies", "0", "--data-dir", str(tmp_path / "d"))
    assert proc.returncode == 2
    assert "cluster up" not in proc.stdout
    assert "--bookies" in proc.stderr


def test_a_client_at_a_mistyped_sqlite_path_fails_without_creating_a_database(tmp_path: Path) -> None:
    typo = tmp_path / "metdata.db"
    code = ("import asyncio, sys\n"
            "from ledgerstore.cli.common import cluster_client, handle_errors\n"
            "async def go():\n"
            "    async with cluster_client(metadata=sys.argv[1]) as c:\n"
            "        print(len(await c.list_bookies()))\n"
            "handle_errors(lambda: asyncio.run(go()))()\n")
    line = one_line_failure(subprocess.run([sys.executable, "-c", code, f"sqlite://{typo}"],
                                           capture_output=True, text=True, timeout=60))
    assert "no cluster is initialised at" in line
    assert not typo.exists()
    # an existing store that holds no cluster is refused the same way
    sqlite3.connect(typo).close()
    line = one_line_failure(subprocess.run([sys.executable, "-c", code, f"sqlite://{typo}"],
                                           capture_output=True, text=True, timeout=60))
    assert "no cluster is initialised at" in line


def test_a_client_at_an_unreachable_metadata_store_fails_in_one_line() -> None:
    uri = f"zk://127.0.0.1:{free_ports(1)[0]}/ledgers"
    code = ("import asyncio, sys\n"
            "from ledgerstore.cli.common import cluster_client, handle_errors\n"
            "async def go():\n"
            "    async with cluster_client(metadata=sys.argv[1], metadata_options={'connect_timeout': 1}):\n"
            "        pass\n"
            "handle_errors(lambda: asyncio.run(go()))()\n")
    line = one_line_failure(subprocess.run([sys.executable, "-c", code, uri], capture_output=True, text=True,
                                           timeout=60))
    assert "could not connect to ZooKeeper" in line


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as fh:
        return [int(x) for x in fh.read().split()]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def _start_standalone(data_dir: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([*CLI, "standalone", "--data-dir", str(data_dir), "--bookies", "2", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = []
    for line in proc.stdout:
        out.append(line)
        if "serving" in line:
            return proc, "".join(out)
    proc.wait(30)
    pytest.fail("standalone did not come up:\n" + "".join(out))


def _wait_gone(pids: list[int], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not all(_gone(p) for p in pids):
        assert time.monotonic() < deadline, f"bookies still running: {[p for p in pids if not _gone(p)]}"
        time.sleep(0.1)


def test_kill_9_of_the_standalone_leaves_no_bookie_running(tmp_path: Path) -> None:
    base = free_ports(1)[0]
    while not all(_port_free(p) for p in (base, base + 1)):
        base = free_ports(1)[0]
    proc, _ = _start_standalone(tmp_path / "d", "--port-base", str(base))
    bookies = _children(proc.pid)
    assert len(bookies) == 3  # two bookies and the metadata server: none may outlive the standalone
    try:
        proc.kill()
        proc.wait(30)
        _wait_gone(bookies)
    finally:  # a failing run must not leave its bookies behind either
        for pid in bookies:
            if not _gone(pid):
                os.kill(pid, signal.SIGKILL)
    again, out = _start_standalone(tmp_path / "d", "--port-base", str(base))  # its ports are free again
    try:
        assert "cluster up" in out
    finally:
        again.send_signal(signal.SIGTERM)
        again.wait(60)


def test_a_second_standalone_on_taken_ports_fails_in_one_line_or_picks_free_ones(tmp_path: Path) -> None:
    base = free_ports(1)[0]
    while not all(_port_free(p) for p in (base, base + 1)):
        base = free_ports(1)[0]
    first, _ = _start_standalone(tmp_path / "a", "--port-base", str(base))
    try:
        second = run_cli("standalone", "--data-dir", str(tmp_path / "b"), "--bookies", "2", "--port-base", str(base))
        assert second.returncode == 1
        assert "cluster up" not in second.stdout
        assert "Traceback" not in second.stderr
        errors = [line for line in second.stderr.splitlines() if line.strip()]
        assert len(errors) == 1 and f"port {base} is already in use by pid" in errors[0], second.stderr
        third, out = _start_standalone(tmp_path / "c", "--port-base", "0")
        third.send_signal(signal.SIGTERM)
        third.wait(60)
        assert "cluster up" in out and f":{base}" not in out
    finally:
        first.send_signal(signal.SIGTERM)
        first.wait(60)


def _port_free(port: int) -> bool:
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def test_a_sqlite_bookie_goes_through_the_metadata_server_unless_direct_mode_is_asked_for(tmp_path: Path) -> None:
    """A bookie never falls back to opening a shared sqlite file by itself: a paused process holding
    its write lock would stall every bookie. Without a metadata server it fails in one line saying
    how to start one, or how to ask for direct mode."""
    from ledgerstore.cluster import start_metadata_server_process, stop_process

    cfg = bookie_config(tmp_path, extra="metadata_start_retry_s = 0\n[bookie.metadata_options]\nsession_ttl = 5\n")
    line = one_line_failure(run_cli("bookie", "--config", str(cfg)))
    assert "no sqlite metadata server serves" in line and "ledgerstore metadata-server --db" in line, line
    assert "server = 'never'" in line
    assert cookies_anywhere(tmp_path) == []
    server = start_metadata_server_process(tmp_path / "meta.db", tmp_path / "metadata-server.log")
    try:
        proc = subprocess.Popen([*CLI, "bookie", "--config", str(cfg)], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            read_until_ready(proc, [])
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
    finally:
        stop_process(server)

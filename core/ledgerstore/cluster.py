"""A cluster of bookie processes on this machine: used by ``ledgerstore standalone``, by the test
suite and by benchmarks. Each bookie is its own process, started from its own config file and
stopped by its PID. With a sqlite metadata store the cluster can run the file's metadata server
(``ledgerstore metadata-server``) as one more process, started first and stopped last."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ledgerstore.errors import ConfigError, LedgerStoreError
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore.ports import free_ports
from ledgerstore.startup import (
    SUPERVISOR_PID_ENV,
    check_port_free,
    prepare_dirs,
    set_parent_death_signal,
    start_metadata_store,
)

T = TypeVar("T")


class LocalCluster:
    """Start, kill, restart and stop bookie processes sharing one metadata store. With sqlite
    metadata (the default) a metadata server process owns the file and every bookie and client
    reaches it through that server; ``metadata_server=False`` asks for direct mode."""

    def __init__(
        self,
        data_dir: Path,
        bookies: int = 3,
        port_base: int | None = 3181,
        storage: str = "entrylog",
        transport: str = "tcp",
        extra_bookie_config: str = "",
        metadata: str | None = None,
        env: dict[str, str] | None = None,
        supervise: bool = False,
        metadata_server: bool | None = None,
    ) -> None:
        if bookies < 1:
            raise ConfigError(f"a cluster needs at least one bookie, not {bookies}")
        if port_base and not 1 <= port_base <= 65536 - bookies:
            raise ConfigError(f"port base {port_base} with {bookies} bookies leaves the port range 1-65535; "
                              "choose a lower one, or 0 for free ports")
        self.data_dir = Path(data_dir).resolve()
        self.n = bookies
        self.ports = [port_base + i for i in range(bookies)] if port_base else free_ports(bookies)
        # A cluster restarted on its directory keeps its bookies' ports: they are its bookie ids.
        self.ports = [self._configured_port(i) or port for i, port in enumerate(self.ports)]
        #: bookies die with this process (``ledgerstore standalone``): parent-death signal plus the
        #: bookie watching its parent id, so a kill -9 of the supervisor leaves no bookie behind
        self.supervise = supervise
        self.storage = storage
        self.transport = transport
        self.extra = extra_bookie_config
        self.metadata = metadata or f"sqlite://{self.data_dir / 'metadata.db'}"
        self.env = env
        #: run the sqlite file's metadata server, so no bookie or client holds the database's
        #: write lock (a paused process holding it would stall every other). The default for
        #: sqlite metadata; ``False`` asks for direct mode (every process opens the file)
        self.metadata_server = self.metadata.startswith("sqlite://") if metadata_server is None else metadata_server
        if metadata_server and not self.metadata.startswith("sqlite://"):
            raise ConfigError(f"a metadata server serves sqlite:// metadata only, not {self.metadata}")
        self.server_proc: subprocess.Popen[bytes] | None = None
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        #: environment of one bookie on top of ``env`` (``standalone --http-port-base``: each
        #: bookie's own admin HTTP port as ``LEDGERSTORE_BOOKIE_HTTP_PORT``)
        self.bookie_env: dict[int, dict[str, str]] = {}
        self._log_offsets: dict[int, int] = {}

    def _configured_port(self, i: int) -> int | None:
        try:
            with open(self.config_path(i), "rb") as fh:
                listen = str(tomllib.load(fh).get("bookie", {}).get("listen", ""))
        except (OSError, tomllib.TOMLDecodeError):
            return None
        port = listen.rpartition(":")[2]
        return int(port) if port.isdigit() else None

    def address(self, i: int) -> str:
        return f"{self.transport}://127.0.0.1:{self.ports[i]}"

    def bookie_id(self, i: int) -> str:
        return f"127.0.0.1:{self.ports[i]}"

    def config_path(self, i: int) -> Path:
        return self.data_dir / f"bookie-{i}" / "bookie.toml"

    def log_path(self, i: int) -> Path:
        return self.config_path(i).parent / "bookie.log"

    def add_bookie(self) -> int:
        """Configure one more bookie (not started); returns its index."""
        self.ports.append(free_ports(1)[0])
        self.n += 1
        self.write_configs()
        return self.n - 1

    def write_configs(self) -> None:
        for i in range(self.n):
            p = self.config_path(i)
            p.parent.mkdir(parents=True, exist_ok=True)
            if p.exists():
                continue  # keep an existing cluster's configuration (and so its bookie ids)
            p.write_text(
                "[bookie]\n"
                f'metadata = "{self.metadata}"\n'
                f'listen = "{self.address(i)}"\n'
                'journal_dir = "journal"\n'
                'ledger_dirs = ["ledgers"]\n'
                f'storage = "{self.storage}"\n'
                + ("" if "flush_interval_ms" in self.extra else "flush_interval_ms = 10000\n")
                # a sqlite bookie requires the metadata server by default (tools reading this file
                # while the cluster is stopped open the database directly)
                + self.extra
            )

    @property
    def metadata_server_log(self) -> Path:
        return self.data_dir / "metadata-server.log"

    def start_metadata_server(self, timeout: float = 30.0) -> subprocess.Popen[bytes]:
        """Start the sqlite metadata server (supervised like the bookies) and wait until it serves."""
        db = self.metadata.removeprefix("sqlite://")
        self.server_proc = start_metadata_server_process(
            db, self.metadata_server_log, env=self.env, supervise=self.supervise, timeout=timeout
        )
        return self.server_proc

    def stop_metadata_server(self, sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
        """Stop the metadata server (SIGKILL with ``sig=signal.SIGKILL``) and reap it."""
        proc, self.server_proc = self.server_proc, None
        if proc is not None:
            stop_process(proc, sig, timeout)

    def start_bookie(self, i: int) -> subprocess.Popen[bytes]:
        """Start bookie ``i`` (and the metadata server first, when the cluster runs one and it is
        not running: its bookies require it)."""
        if self.metadata_server and (self.server_proc is None or self.server_proc.poll() is not None):
            self.start_metadata_server()
        self._log_offsets[i] = self.log_path(i).stat().st_size if self.log_path(i).exists() else 0
        log = open(self.log_path(i), "ab")
        env = dict(os.environ, **(self.env or {}), **self.bookie_env.get(i, {}))
        if not self.metadata_server and self.metadata.startswith("sqlite://"):
            # direct mode was asked for: bookies open the file themselves (they require a server otherwise)
            env.setdefault("LEDGERSTORE_BOOKIE_METADATA_OPTIONS__SERVER", "never")
        if self.supervise:
            env[SUPERVISOR_PID_ENV] = str(os.getpid())
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledgerstore", "bookie", "--config", str(self.config_path(i))],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=env,
            preexec_fn=_die_with_parent if self.supervise else None,
        )
        log.close()
        self.procs[i] = proc
        return proc

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Check the ports are free, create the cluster (its instance id) in the metadata store,
        start every bookie and wait until all registered."""
        prepare_dirs([("data dir", self.data_dir)])
        for i in range(self.n):
            check_port_free(f"bookie {i}", "127.0.0.1", self.ports[i])
        self.write_configs()
        if self.metadata_server and (self.server_proc is None or self.server_proc.poll() is not None):
            self.start_metadata_server()  # before init_cluster: nothing opens the file directly
        self.init_cluster()
        for i in range(self.n):
            self.start_bookie(i)
        self.wait_registered(range(self.n), timeout)
        return self

    def init_cluster(self) -> str:
        """Create the cluster instance id in the metadata store if absent; return it."""
        return self._run(self._init_cluster())

    async def _init_cluster(self) -> str:
        store = await start_metadata_store(self.metadata, {}, retry_s=0)
        try:
            return await ClusterManager(store).init()
        finally:
            await store.close()

    async def _registered(self) -> set[str]:
        from ledgerstore.meta.bookies import BookieRegistry
        from ledgerstore.plugins import create_metadata_store

        store = create_metadata_store(self.metadata)
        await store.start()
        try:
            return {b.bookie_id for b in await BookieRegistry(store).all()}
        finally:
            await store.close()

    def registered(self) -> set[str]:
        """Ids of the registered bookies (callable from inside or outside an event loop)."""
        return self._run(self._registered())

    @staticmethod
    def _run(coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` to completion from inside or outside an event loop."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coro).result()

    def wait_registered(self, which: range | list[int], timeout: float = 60.0) -> None:
        want = {self.bookie_id(i) for i in which}
        deadline = time.monotonic() + timeout
        while True:
            for i, p in self.procs.items():
                if p.poll() is not None and i in which:
                    raise LedgerStoreError(f"bookie {i} exited with code {p.returncode}: {self._last_line(i)} "
                                           f"(log: {self.log_path(i)})")
            if all(self._ready(i) for i in which) and want <= self.registered():
                return
            if time.monotonic() > deadline:
                raise LedgerStoreError(f"bookies {sorted(want - self.registered())} did not register within {timeout}s")
            time.sleep(0.1)

    def _last_line(self, i: int) -> str:
        """The last line bookie ``i`` logged since its start (its one-line start-up error)."""
        try:
            with open(self.log_path(i), "rb") as fh:
                fh.seek(self._log_offsets.get(i, 0))
                lines = fh.read().decode(errors="replace").strip().splitlines()
        except OSError:
            return "(no log)"
        return lines[-1] if lines else "(nothing logged)"

    def _ready(self, i: int) -> bool:
        # A killed bookie's ephemeral registration outlives it by up to the session timeout, so
        # "registered" alone does not mean the new process is up: wait for its own "ready" line.
        try:
            with open(self.log_path(i), "rb") as fh:
                fh.seek(self._log_offsets.get(i, 0))
                return b" ready\n" in fh.read()
        except OSError:
            return False

    def kill(self, i: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL) to bookie ``i`` and reap it."""
        p = self.procs.pop(i)
        if p.poll() is None:
            os.kill(p.pid, sig)
        p.wait(30)

    def restart(self, i: int, timeout: float = 60.0) -> None:
        """Start bookie ``i`` again on its port. Right after a SIGKILL the port can still be
        reported in use for a moment; that (and only that) is retried for a few seconds."""
        for attempt in range(10):
            self.start_bookie(i)
            try:
                self.wait_registered([i], timeout)
                return
            except LedgerStoreError as exc:
                if "already in use" not in str(exc) or attempt == 9:
                    raise LedgerStoreError(f"{exc}\nsockets on port {self.ports[i]}:\n{self._sockets(i)}") from None
                self.procs.pop(i, None)
                time.sleep(0.5)

    def _sockets(self, i: int) -> str:
        try:
            out = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=10).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            return f"(ss failed: {exc})"
        return "\n".join(line for line in out.splitlines() if f":{self.ports[i]} " in line) or "(none)"

    def stop(self, timeout: float = 30.0) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()
        # Last: the bookies needed it to end their sessions cleanly.
        self.stop_metadata_server(timeout=max(0.1, deadline - time.monotonic()))

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_metadata_server_process(
    db_path: str | Path,
    log_path: Path,
    *,
    env: dict[str, str] | None = None,
    supervise: bool = False,
    timeout: float = 30.0,
    extra_args: tuple[str, ...] = (),
) -> subprocess.Popen[bytes]:
    """Run ``ledgerstore metadata-server --db db_path`` logging to ``log_path`` and return once it
    serves; :class:`LedgerStoreError` with its last log line if it exits or stays silent.
    ``supervise``: it dies with this process, as a supervised bookie does."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    offset = log_path.stat().st_size if log_path.exists() else 0
    full_env = dict(os.environ, **(env or {}))
    if supervise:
        full_env[SUPERVISOR_PID_ENV] = str(os.getpid())
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ledgerstore", "metadata-server", "--db", str(db_path), *extra_args],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True, env=full_env,
            preexec_fn=_die_with_parent if supervise else None,
        )
    deadline = time.monotonic() + timeout
    while True:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            text = fh.read().decode(errors="replace")
        if " ready on " in text:
            return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc, signal.SIGKILL, 10)
            last = (text.strip().splitlines() or ["(nothing logged)"])[-1]
            raise LedgerStoreError(f"the metadata server for {db_path} did not start: {last} (log: {log_path})")
        time.sleep(0.05)


def stop_process(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 30.0) -> None:
    """Send ``sig`` to ``proc`` (if it still runs) and reap it; SIGKILL if it outlives ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _die_with_parent() -> None:
    """``preexec_fn`` of a supervised bookie: SIGKILL it if the supervisor dies before the bookie
    takes over (it then asks for SIGTERM, to stop cleanly)."""
    set_parent_death_signal(signal.SIGKILL)

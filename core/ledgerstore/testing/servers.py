"""Real ZooKeeper and etcd servers for tests: started as subprocesses on free 127.0.0.1 ports.

Backends (first-party and third-party) test against the real thing, never a stand-in::

    from ledgerstore.testing.servers import ZooKeeperServer

    with ZooKeeperServer() as zk:
        store = MyStore(zk.uri("/my-test"))

or, in a test module or ``conftest.py``, through the session-scoped fixtures::

    pytest_plugins = ["ledgerstore.testing.servers"]

    def test_something(zookeeper_server, etcd_server): ...

Each server keeps its data in a fresh temporary directory, is waited for until it answers
requests (bounded; the error carries the tail of the server's log), and is stopped by its PID:
terminate, wait, then kill. The servers are the Debian packages ``zookeeper`` and ``etcd-server``
(plus Java 17); when they are missing the error says how to install them.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

from ledgerstore.errors import LedgerStoreError
from ledgerstore.ports import free_ports

__all__ = [
    "EtcdServer",
    "ServerHarnessError",
    "ServerNotInstalledError",
    "ZooKeeperServer",
    "etcd_server",
    "free_port",
    "make_pki",
    "zookeeper_command",
    "zookeeper_server",
]

#: Java 17 is what Debian's ZooKeeper 3.8 is built for; the machine may also carry a newer JDK.
DEFAULT_JAVA_HOME = "/usr/lib/jvm/java-17-openjdk-amd64"
ZOOKEEPER_CONF_DIR = "/etc/zookeeper/conf"
ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
#: zookeeper.jar's manifest Class-Path names its dependencies (jute, netty, slf4j-api, ...) but no
#: slf4j binding; slf4j-simple sends the server's log to stderr, which we keep in a file so a
#: failed start can show its tail.
SLF4J_BINDING_JAR = "/usr/share/java/slf4j-simple.jar"
ETCD_BINARY = "etcd"

_SETUP_HINT = (
    "install the test servers with the project's setup "
    "(apt-get install -y zookeeper etcd-server openjdk-17-jre-headless; "
    "see docs/metadata-zookeeper-etcd.md)"
)


class ServerHarnessError(LedgerStoreError):
    """A test server could not be started or stopped."""


class ServerNotInstalledError(ServerHarnessError):
    """The server's binaries are not installed on this machine."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago: below the ephemeral range and in this
    test worker's own slice of ports (see :mod:`ledgerstore.ports`), so a server started on it
    races neither outgoing connections nor a test running at the same time in another worker."""
    return free_ports(1)[0]


def _log_tail(path: Path, lines: int = 40) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


class _ServerProcess:
    """Shared lifecycle: temp dir, subprocess with its output in a log file, readiness, stop by PID."""

    name = "server"
    #: seconds to wait for the server to answer after it was started
    start_timeout = 30.0

    def __init__(self) -> None:
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._log_file: Path | None = None
        self.port = 0

    # --- to implement ----------------------------------------------------------------------

    def _check_installed(self) -> None:
        raise NotImplementedError

    def _prepare(self, workdir: Path) -> tuple[list[str], dict[str, str]]:
        """Write config into ``workdir``; return the command line and environment."""
        raise NotImplementedError

    def _is_ready(self) -> bool:
        raise NotImplementedError

    # --- public ----------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``127.0.0.1:PORT`` of the client port."""
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """PID of the server process (only while it runs)."""
        if self._proc is None:
            raise ServerHarnessError(f"{self.name} is not running: call start() first")
        return self._proc.pid

    @property
    def running(self) -> bool:
        """True while the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        """File holding the server's stdout and stderr."""
        return self._log_file

    def start(self) -> None:
        """Start the server and wait until it answers requests. Idempotent while running."""
        if self.running:
            return
        self._check_installed()
        self._tmp = tempfile.TemporaryDirectory(prefix=f"ledgerstore-{self.name}-")
        workdir = Path(self._tmp.name)
        argv, env = self._prepare(workdir)
        self._log_file = workdir / "server.log"
        with open(self._log_file, "wb") as log:
            # Own process group: a Ctrl-C aimed at pytest must not reach the server before we stop it.
            self._proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=env, cwd=workdir, start_new_session=True,
            )
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self._proc.poll() is not None:
                code = self._proc.returncode
                tail = _log_tail(self._log_file)
                self._cleanup()
                raise ServerHarnessError(
                    f"{self.name} exited with status {code} during start-up "
                    f"(command: {' '.join(argv)}). Log tail:\n{tail}"
                )
            if self._is_ready():
                return
            if time.monotonic() > deadline:
                tail = _log_tail(self._log_file)
                self.stop()
                raise ServerHarnessError(
                    f"{self.name} on {self.address} did not answer within {self.start_timeout:.0f}s "
                    f"(command: {' '.join(argv)}). Log tail:\n{tail}"
                )
            time.sleep(0.1)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server by its PID: SIGTERM, wait up to ``timeout`` s, then SIGKILL. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout)
        self._cleanup()

    def kill(self) -> None:
        """SIGKILL the server (a crash, for fault tests); its data directory is kept until stop()."""
        if self._proc is not None and self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
            self._proc.wait()

    def _cleanup(self) -> None:
        self._proc = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> _ServerProcess:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"pid {self._proc.pid}" if self.running and self._proc else "stopped"
        return f"<{type(self).__name__} {self.address} {state}>"


class ZooKeeperServer(_ServerProcess):
    """A standalone ZooKeeper 3.8 server (Debian's package) on a free 127.0.0.1 port.

    ``tick_time`` is in milliseconds; ZooKeeper accepts session timeouts between 2 and 20 ticks,
    so the default of 500 ms allows sessions from 1 s to 10 s (short ones keep tests fast).
    """

    name = "zookeeper"

    def __init__(self, tick_time: int = 500, java_home: str | None = None) -> None:
        super().__init__()
        self.tick_time = tick_time
        self.java_home = java_home or os.environ.get("LEDGERSTORE_TEST_JAVA_HOME", DEFAULT_JAVA_HOME)

    def __enter__(self) -> ZooKeeperServer:
        self.start()
        return self

    @property
    def java(self) -> str:
        return os.path.join(self.java_home, "bin", "java")

    def uri(self, root: str = "/ledgerstore") -> str:
        """``zk://127.0.0.1:PORT/root``: a MetadataStore URI for this server."""
        return f"zk://{self.address}/{root.lstrip('/')}"

    def _check_installed(self) -> None:
        missing = [p for p in (self.java, ZOOKEEPER_JAR) if not os.path.exists(p)]
        if missing:
            raise ServerNotInstalledError(f"cannot start ZooKeeper: {', '.join(missing)} missing; {_SETUP_HINT}")

    def _prepare(self, workdir: Path) -> tuple[list[str], dict[str, str]]:
        self.port = free_port()
        return zookeeper_command(workdir, "127.0.0.1", self.port, self.tick_time, self.java_home)

    def four_letter_word(self, word: str, timeout: float = 2.0) -> str:
        """Send a four-letter command (``srvr``, ``mntr``, ``cons``...) and return the answer."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(word.encode())
            chunks = []
            while chunk := s.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")

    def _is_ready(self) -> bool:
        # ``srvr`` answers "Mode: standalone" only once the server serves requests; ``ruok`` would
        # already say "imok" while it is still loading its database.
        try:
            return "Mode:" in self.four_letter_word("srvr", timeout=1.0)
        except OSError:
            return False


class EtcdServer(_ServerProcess):
    """A single-member etcd 3.4 server (Debian's ``etcd-server``) on free 127.0.0.1 ports."""

    name = "etcd"

    def __init__(
        self,
        binary: str | None = None,
        extra_args: list[str] | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        client_ca_file: str | None = None,
    ) -> None:
        """``cert_file``/``key_file`` serve clients over TLS; ``client_ca_file`` also requires
        clients to present a certificate signed by that CA (see :func:`make_pki`)."""
        super().__init__()
        self.binary = binary or os.environ.get("LEDGERSTORE_TEST_ETCD", ETCD_BINARY)
        self.extra_args = list(extra_args or [])
        self.peer_port = 0
        if (cert_file is None) != (key_file is None):
            raise ServerHarnessError("EtcdServer: cert_file and key_file go together")
        if client_ca_file is not None and cert_file is None:
            raise ServerHarnessError("EtcdServer: client_ca_file needs cert_file and key_file")
        self.cert_file, self.key_file, self.client_ca_file = cert_file, key_file, client_ca_file

    @property
    def tls(self) -> bool:
        """True when clients must speak TLS."""
        return self.cert_file is not None

    def __enter__(self) -> EtcdServer:
        self.start()
        return self

    def uri(self, prefix: str = "/ledgerstore") -> str:
        """``etcd://127.0.0.1:PORT/prefix``: a MetadataStore URI for this server."""
        return f"etcd://{self.address}/{prefix.lstrip('/')}"

    def _check_installed(self) -> None:
        if shutil.which(self.binary) is None:
            raise ServerNotInstalledError(f"cannot start etcd: {self.binary!r} not found on PATH; {_SETUP_HINT}")

    def _prepare(self, workdir: Path) -> tuple[list[str], dict[str, str]]:
        self.port, self.peer_port = free_ports(2)
        client = f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        tls_args: list[str] = []
        if self.tls:
            tls_args = ["--cert-file", str(self.cert_file), "--key-file", str(self.key_file)]
            if self.client_ca_file is not None:
                tls_args += ["--client-cert-auth", "--trusted-ca-file", self.client_ca_file]
        argv = [
            shutil.which(self.binary) or self.binary,
            "--name", "default",
            "--data-dir", str(workdir / "data"),
            "--listen-client-urls", client,
            "--advertise-client-urls", client,
            "--listen-peer-urls", peer,
            "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"default={peer}",
            *tls_args,
            *self.extra_args,
        ]
        return argv, dict(os.environ)

    def _is_ready(self) -> bool:
        context = None
        if self.tls:
            # Readiness only: whether the server answers, not whom it proves to be.
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            if self.client_ca_file is not None:
                context.load_cert_chain(str(self.cert_file), str(self.key_file))
        scheme = "https" if self.tls else "http"
        try:
            with urllib.request.urlopen(f"{scheme}://{self.address}/health", timeout=1.0, context=context) as resp:
                return b'"health":"true"' in resp.read()
        except (OSError, urllib.error.URLError):
            return False


def zookeeper_command(workdir: Path, address: str, port: int, tick_time: int = 500,
                      java_home: str = DEFAULT_JAVA_HOME) -> tuple[list[str], dict[str, str]]:
    """Write a standalone ZooKeeper's ``zoo.cfg`` (data in ``workdir/data``, clients served on
    ``address:port``) and return the command line and environment that run it."""
    data = workdir / "data"
    data.mkdir(parents=True, exist_ok=True)
    (workdir / "zoo.cfg").write_text(
        f"tickTime={tick_time}\n"
        f"dataDir={data}\n"
        f"clientPort={port}\n"
        f"clientPortAddress={address}\n"
        "admin.enableServer=false\n"
        "4lw.commands.whitelist=*\n"
        # Tests create many short sessions from one address.
        "maxClientCnxns=0\n"
    )
    classpath = [ZOOKEEPER_CONF_DIR, ZOOKEEPER_JAR]
    if os.path.exists(SLF4J_BINDING_JAR):
        classpath.append(SLF4J_BINDING_JAR)
    argv = [
        os.path.join(java_home, "bin", "java"), "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
        "-Dzookeeper.jmx.log4j.disable=true",
        "-cp", ":".join(classpath),
        "org.apache.zookeeper.server.quorum.QuorumPeerMain", str(workdir / "zoo.cfg"),
    ]
    return argv, dict(os.environ, JAVA_HOME=java_home)


def make_pki(directory: str | Path) -> dict[str, str]:
    """Make a throwaway CA, a server certificate for 127.0.0.1/localhost (usable as a client
    certificate too, as etcd members' often are) and a client certificate with the openssl command. Returns paths keyed ``ca.pem``, ``server.pem``, ``server.key``,
    ``client.pem``, ``client.key``."""
    if shutil.which("openssl") is None:
        raise ServerNotInstalledError(f"cannot make test certificates: the openssl command is missing; {_SETUP_HINT}")
    directory = Path(directory)

    def openssl(*args: str) -> None:
        done = subprocess.run(["openssl", *args], cwd=directory, capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise ServerHarnessError(f"openssl {' '.join(args)} failed: {done.stderr.strip()}")

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
            "-subj", "/CN=ledgerstore test CA",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    for name, ext in (("server", "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        (directory / f"{name}.ext").write_text(ext)
        openssl("req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext")
    return {name: str(directory / name) for name in ("ca.pem", "server.pem", "server.key", "client.pem", "client.key")}


# --- pytest fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def zookeeper_server() -> Iterator[ZooKeeperServer]:
    """One real ZooKeeper server for the whole test session (tickTime 500 ms)."""
    with ZooKeeperServer() as server:
        yield server


@pytest.fixture(scope="session")
def etcd_server() -> Iterator[EtcdServer]:
    """One real etcd server for the whole test session."""
    with EtcdServer() as server:
        yield server


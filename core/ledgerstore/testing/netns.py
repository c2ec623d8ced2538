"""A cluster across hosts on one machine: Linux network namespaces joined by one bridge.

Every test host is a network namespace with its own address on a private /24 (10.X.Y.0/24,
chosen so it overlaps no route of this machine) and its own hostname in its hosts file; the
bridge lives in a namespace of its own, and no namespace has a default route, NAT or a link to
the machine's network: traffic flows only between the addresses the cluster made::

    with NetCluster(["meta", "b1", "b2", "b3", "client"]) as net:
        etcd = net.start_etcd("meta")
        for b in ("b1", "b2", "b3"):
            net.start_bookie(b, etcd.uri("/ledgers"))
        proc = net.popen("client", [sys.executable, "my_client.py", etcd.uri("/ledgers")])
        net.link_down("b2")            # a silent partition: packets vanish, nobody sees a reset
        net.cut("client", ["meta"])    # the client no longer reaches the metadata server
        net.heal()                     # every link up, every cut removed

The metadata host may run ZooKeeper (:meth:`NetCluster.start_zookeeper`) or the sqlite metadata
server (:meth:`NetCluster.start_sqlite`: ``sqlite+tcp://`` with a secret file) instead of etcd. A
host may run a Kafka front end (:meth:`NetCluster.start_kafka`), which Kafka clients on other
hosts reach by the host's name.

Processes run inside a host with ``ip netns exec``, which also bind-mounts the namespace's
``/etc/netns/NAME/hosts`` over ``/etc/hosts``, so the hostnames resolve there and only there.

Partitions are silent, as a pulled cable or a dropping firewall is: :meth:`NetCluster.link_down`
takes the host's port on the bridge down (its packets are dropped, no RST, no ICMP), and
:meth:`NetCluster.cut` adds nftables DROP rules inside the host's namespace for the addresses of
the chosen hosts, both ways. Only timeouts and keepalives notice either.

Everything made is removed by :meth:`NetCluster.close`: processes by their PID (SIGTERM, then
SIGKILL), namespaces (which takes their veths and the bridge with them) and the ``/etc/netns``
directories. ``close`` runs from the context manager, from the pytest fixture's finalizer and,
should the test process exit without either, from ``atexit``. A cluster left by a killed process
is removed by ``scripts/netcluster.py down TAG`` (its state file is ``/run/ledgerstore-netns/TAG.json``).

Creating namespaces needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN), ``ip`` (iproute2) and ``nft``
(nftables); :func:`netns_unavailable` says in one line what is missing, and the tests skip with it.
"""

from __future__ import annotations

import atexit
import dataclasses
import ipaddress
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from types import TracebackType

import pytest

from ledgerstore.errors import LedgerStoreError
from ledgerstore.testing.servers import DEFAULT_JAVA_HOME, ZOOKEEPER_JAR, zookeeper_command

__all__ = [
    "BOOKIE_PORT",
    "ETCD_PORT",
    "KAFKA_PORT",
    "ZOOKEEPER_PORT",
    "Host",
    "NetCluster",
    "SQLITE_PORT",
    "NetnsError",
    "Service",
    "attach",
    "issue_certs",
    "netns_unavailable",
    "random_partitions",
    "remove_cluster",
]

#: every bookie host listens on this port: each host has an address of its own
BOOKIE_PORT = 3181
#: the etcd client port on the metadata host
ETCD_PORT = 2379
#: the ZooKeeper client port on the metadata host
ZOOKEEPER_PORT = 2181
#: the sqlite metadata server's TCP port on the metadata host
SQLITE_PORT = 4181
#: a Kafka front end's port on its host
KAFKA_PORT = 9092
#: where a running cluster records its namespaces, so another process can partition or remove it
STATE_DIR = Path("/run/ledgerstore-netns")
NETNS_ETC = Path("/etc/netns")
#: the nftables table holding a host's cut; deleting it heals the cut
_CUT_TABLE = "ledgerstore_cut"
_SETUP_HINT = "run scripts/setup.sh as root (it installs iproute2 and nftables)"


class NetnsError(LedgerStoreError):
    """A namespace, link or rule could not be made or removed, or a process did not start."""


def _run(argv: Sequence[str], stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=30)
    if check and done.returncode:
        raise NetnsError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}")
    return done


def netns_unavailable() -> str | None:
    """``None`` when this process can build a :class:`NetCluster`; otherwise one line saying why not."""
    if sys.platform != "linux":
        return f"network namespaces need Linux, not {sys.platform}"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"the {tool!r} command ({package}) is missing; {_SETUP_HINT}"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    probe = f"lsprobe-{os.getpid()}"
    done = _run(["ip", "netns", "add", probe], check=False)
    if done.returncode:
        return f"cannot create a network namespace: {done.stderr.strip()}"
    _run(["ip", "netns", "del", probe], check=False)
    return None


def _used_networks() -> list[ipaddress.IPv4Network]:
    out = _run(["ip", "-4", "-o", "route", "show", "table", "all"], check=False).stdout
    nets = []
    for line in out.splitlines():
        dest = line.split()[0] if line.split() else ""
        if dest in ("default", "broadcast", "local", "unreachable", "blackhole", "prohibit"):
            dest = line.split()[1] if dest != "default" and len(line.split()) > 1 else ""
        try:
            nets.append(ipaddress.IPv4Network(dest, strict=False))
        except ValueError:
            continue
    return nets


def _free_subnet(rnd: random.Random) -> ipaddress.IPv4Network:
    """A 10.X.Y.0/24 that overlaps no route of this machine's namespace."""
    used = _used_networks()
    for _ in range(200):
        net = ipaddress.IPv4Network(f"10.{rnd.randrange(64, 250)}.{rnd.randrange(1, 250)}.0/24")
        if not any(net.overlaps(u) for u in used if u.prefixlen > 0):
            return net
    raise NetnsError("no free 10.X.Y.0/24 found: every candidate overlaps a route of this machine")


@dataclasses.dataclass(frozen=True)
class Host:
    """One test host: its name, namespace, address and hostname."""

    name: str
    netns: str
    address: str
    hostname: str
    #: the host's port on the bridge (in the bridge's namespace)
    port: str


@dataclasses.dataclass
class Service:
    """A process started in a host, with its log."""

    host: Host
    proc: subprocess.Popen[bytes]
    log_path: Path
    port: int = 0
    #: the file holding the secret its clients prove (the sqlite metadata server's)
    secret_file: Path | None = None

    @property
    def address(self) -> str:
        """``host-address:port`` of the service."""
        return f"{self.host.address}:{self.port}"

    def uri(self, root: str = "/ledgerstore", scheme: str = "etcd") -> str:
        """A metadata-store URI for this service, by the host's address (``sqlite+tcp`` names
        the address only: the sqlite metadata server serves one database, with no root)."""
        if scheme == "sqlite+tcp":
            return f"{scheme}://{self.address}"
        return f"{scheme}://{self.address}/{root.lstrip('/')}"

    def log_text(self) -> str:
        """What the process logged so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


class NetCluster:
    """Hosts in network namespaces on one bridge, their processes, and partitions between them.

    ``hosts``: the host names (short: each becomes ``NAME.cluster.test`` and ``NAME`` in every
    host's hosts file). ``subnet``: a /24 to use (default: a free 10.X.Y.0/24). ``workdir``: where
    logs and data go (default: a temporary directory removed by :meth:`close`).
    """

    def __init__(self, hosts: Sequence[str], subnet: str | None = None, workdir: str | Path | None = None,
                 domain: str = "cluster.test") -> None:
        if not hosts or len(set(hosts)) != len(hosts):
            raise NetnsError(f"hosts must be distinct names, got {list(hosts)}")
        for h in hosts:
            if not h.isalnum() or len(h) > 10:
                raise NetnsError(f"host name {h!r} must be letters and digits, at most 10 of them")
        rnd = random.SystemRandom()
        self.tag = f"{os.getpid() % 100000:05d}{rnd.randrange(16**3):03x}"
        self.subnet = ipaddress.IPv4Network(subnet) if subnet else _free_subnet(random.Random(rnd.random()))
        if self.subnet.prefixlen > 28 or len(hosts) > self.subnet.num_addresses - 3:
            raise NetnsError(f"subnet {self.subnet} is too small for {len(hosts)} hosts")
        addrs = list(self.subnet.hosts())
        self.bridge_ns = f"ls{self.tag}-sw"
        self.hosts: dict[str, Host] = {
            name: Host(name=name, netns=f"ls{self.tag}-{name}", address=str(addrs[i + 1]),
                       hostname=f"{name}.{domain}", port=f"p{i}")
            for i, name in enumerate(hosts)
        }
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        if workdir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix=f"ledgerstore-net-{self.tag}-")
            workdir = self._tmp.name
        self.workdir = Path(workdir)
        self.services: list[Service] = []
        self._started = False

    # --- life cycle ---------------------------------------------------------------------------

    def start(self) -> NetCluster:
        """Make the bridge, the hosts and their hosts files. On any failure, undo what was made."""
        if self._started:
            return self
        why = netns_unavailable()
        if why:
            raise NetnsError(why)
        self._started = True
        atexit.register(self.close)
        try:
            self._write_state()
            _run(["ip", "netns", "add", self.bridge_ns])
            _run(["ip", "-n", self.bridge_ns, "link", "add", "br0", "type", "bridge"])
            _run(["ip", "-n", self.bridge_ns, "link", "set", "br0", "up"])
            hosts_file = "127.0.0.1 localhost\n" + "".join(
                f"{h.address} {h.hostname} {h.name}\n" for h in self.hosts.values())
            for h in self.hosts.values():
                _run(["ip", "netns", "add", h.netns])
                etc = NETNS_ETC / h.netns
                etc.mkdir(parents=True, exist_ok=True)
                (etc / "hosts").write_text(hosts_file)
                _run(["ip", "link", "add", "eth0", "netns", h.netns, "type", "veth",
                      "peer", "name", h.port, "netns", self.bridge_ns])
                _run(["ip", "-n", self.bridge_ns, "link", "set", h.port, "master", "br0", "up"])
                _run(["ip", "-n", h.netns, "addr", "add", f"{h.address}/{self.subnet.prefixlen}", "dev", "eth0"])
                _run(["ip", "-n", h.netns, "link", "set", "eth0", "up"])
                _run(["ip", "-n", h.netns, "link", "set", "lo", "up"])
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Stop every process started here, remove the namespaces and their files. Idempotent."""
        for svc in self.services:
            _stop(svc.proc)
        self.services.clear()
        if self._started:
            remove_cluster(self.tag, [h.netns for h in self.hosts.values()] + [self.bridge_ns])
            self._started = False
            atexit.unregister(self.close)
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self) -> NetCluster:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _write_state(self) -> None:
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        state = {"tag": self.tag, "subnet": str(self.subnet), "bridge_ns": self.bridge_ns,
                 "hosts": {n: dataclasses.asdict(h) for n, h in self.hosts.items()}}
        (STATE_DIR / f"{self.tag}.json").write_text(json.dumps(state, indent=2))

    # --- processes ----------------------------------------------------------------------------

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        try:
            return self.hosts[name]
        except KeyError:
            raise NetnsError(f"no host {name!r}; hosts: {', '.join(self.hosts)}") from None

    def command(self, host: str, argv: Sequence[str]) -> list[str]:
        """``argv`` as run inside ``host``."""
        return ["ip", "netns", "exec", self.host(host).netns, *argv]

    def popen(self, host: str, argv: Sequence[str], *, log: str | None = None, stdin: int | None = subprocess.DEVNULL,
              stdout: int | None = None, env: dict[str, str] | None = None, port: int = 0) -> Service:
        """Start ``argv`` in ``host``; stopped by :meth:`close` (or :meth:`stop`) by its PID.
        Its output goes to ``log`` (a file name under the work directory) unless ``stdout`` is given."""
        h = self.host(host)
        log_path = self.workdir / (log or f"{host}-{len(self.services)}.log")
        log_path.parent.mkdir(parents=True, exist_ok=True)
        full_env = dict(os.environ, **(env or {}))
        with open(log_path, "ab") as fh:
            proc = subprocess.Popen(self.command(host, argv), stdin=stdin, stdout=stdout if stdout is not None else fh,
                                    stderr=fh, env=full_env, start_new_session=True)
        svc = Service(h, proc, log_path, port)
        self.services.append(svc)
        return svc

    def stop(self, svc: Service, sig: int = signal.SIGTERM) -> None:
        """Stop one process by its PID (``sig`` first, SIGKILL after 10 s)."""
        _stop(svc.proc, sig)
        if svc in self.services:
            self.services.remove(svc)

    def can_connect(self, host: str, address: str, port: int) -> bool:
        """Whether a TCP connection from ``host`` to ``address:port`` opens within a second."""
        done = subprocess.run(self.command(host, ["timeout", "1", "bash", "-c", f"exec 3<>/dev/tcp/{address}/{port}"]),
                              capture_output=True, timeout=10)
        return done.returncode == 0

    def wait_for(self, svc: Service, text: str, timeout: float = 30.0) -> None:
        """Wait until ``svc`` logged ``text``; :class:`NetnsError` with its last line if it exits first."""
        deadline = time.monotonic() + timeout
        while text not in svc.log_text():
            if svc.proc.poll() is not None or time.monotonic() > deadline:
                last = (svc.log_text().strip().splitlines() or ["(nothing logged)"])[-1]
                state = f"exited with {svc.proc.returncode}" if svc.proc.poll() is not None else "still silent"
                raise NetnsError(f"{svc.log_path.name} on {svc.host.name} {state} before logging {text!r}: {last}")
            time.sleep(0.05)

    def start_etcd(self, host: str, timeout: float = 30.0) -> Service:
        """A single-member etcd serving clients on ``host``'s address, port :data:`ETCD_PORT`."""
        binary = shutil.which(os.environ.get("LEDGERSTORE_TEST_ETCD", "etcd"))
        if binary is None:
            raise NetnsError("etcd is not installed; run scripts/setup.sh")
        h = self.host(host)
        client = f"http://{h.address}:{ETCD_PORT}"
        peer = "http://127.0.0.1:2380"
        svc = self.popen(host, [
            binary, "--name", h.name, "--data-dir", str(self.workdir / f"etcd-{h.name}"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"{h.name}={peer}",
        ], log=f"etcd-{h.name}.log", port=ETCD_PORT)
        self.wait_for(svc, "ready to serve client requests", timeout)
        return svc

    def start_zookeeper(self, host: str, timeout: float = 60.0) -> Service:
        """A standalone ZooKeeper serving clients on ``host``'s address, port :data:`ZOOKEEPER_PORT`."""
        java_home = os.environ.get("LEDGERSTORE_TEST_JAVA_HOME", DEFAULT_JAVA_HOME)
        if not os.path.exists(ZOOKEEPER_JAR) or not os.path.isdir(java_home):
            raise NetnsError(f"ZooKeeper ({ZOOKEEPER_JAR}) or Java ({java_home}) is missing; run scripts/setup.sh")
        h = self.host(host)
        workdir = self.workdir / f"zookeeper-{h.name}"
        workdir.mkdir(parents=True, exist_ok=True)
        argv, env = zookeeper_command(workdir, h.address, ZOOKEEPER_PORT, java_home=java_home)
        svc = self.popen(host, argv, log=f"zookeeper-{h.name}.log", env=env, port=ZOOKEEPER_PORT)
        deadline = time.monotonic() + timeout
        probe = f"exec 3<>/dev/tcp/{h.address}/{ZOOKEEPER_PORT}; echo srvr >&3; cat <&3"
        while True:
            done = subprocess.run(self.command(host, ["timeout", "2", "bash", "-c", probe]),
                                  capture_output=True, text=True, timeout=10)
            if "Mode:" in done.stdout:
                return svc
            if svc.proc.poll() is not None or time.monotonic() > deadline:
                raise NetnsError(f"ZooKeeper on {host} did not start: {svc.log_text()[-500:] or '(nothing logged)'}")
            time.sleep(0.2)

    def start_sqlite(self, host: str, timeout: float = 30.0) -> Service:
        """A sqlite metadata server (``ledgerstore metadata-server``) on ``host``, serving TCP on
        the host's address, port :data:`SQLITE_PORT`, to clients that prove the secret in its
        :attr:`Service.secret_file` (made here, mode 0600). Clients use ``svc.uri(scheme="sqlite+tcp")``
        with the metadata option ``secret_file``."""
        h = self.host(host)
        d = self.workdir / f"sqlite-{h.name}"
        d.mkdir(parents=True, exist_ok=True)
        secret = d / "secret"
        fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(os.urandom(32).hex() + "\n")
        svc = self.popen(host, [sys.executable, "-m", "ledgerstore", "metadata-server", "--db", str(d / "meta.db"),
                                "--listen", f"{h.address}:{SQLITE_PORT}", "--secret-file", str(secret)],
                         log=f"sqlite-{h.name}.log", port=SQLITE_PORT)
        svc.secret_file = secret
        self.wait_for(svc, " ready on ", timeout)
        return svc

    def bookie_config(self, host: str, metadata: str, extra: str = "", *, listen_any: bool = False,
                      scheme: str = "tcp") -> Path:
        """Write the config of a bookie on ``host`` and return its path. It advertises the host's
        name (``NAME.cluster.test:3181``); ``listen_any`` binds 0.0.0.0 instead of the host's address;
        ``scheme`` is the transport (``tcp+tls`` needs a ``[bookie.transport]`` table in ``extra``)."""
        h = self.host(host)
        d = self.workdir / f"bookie-{h.name}"
        d.mkdir(parents=True, exist_ok=True)
        path = d / "bookie.toml"
        listen = f"0.0.0.0:{BOOKIE_PORT}" if listen_any else f"{h.address}:{BOOKIE_PORT}"
        path.write_text(
            "[bookie]\n"
            f'metadata = "{metadata}"\n'
            f'listen = "{scheme}://{listen}"\n'
            f'advertised_address = "{scheme}://{h.hostname}:{BOOKIE_PORT}"\n'
            f'journal_dir = "{d / "journal"}"\n'
            f'ledger_dirs = ["{d / "ledgers"}"]\n'
            "flush_interval_ms = 10000\n"
            "gc_wait_time_ms = 0\n"
            + extra
        )
        return path

    def start_bookie(self, host: str, metadata: str, extra: str = "", *, wait: bool = True,
                     listen_any: bool = False, scheme: str = "tcp") -> Service:
        """A bookie process on ``host`` (see :meth:`bookie_config`); waits until it is ready."""
        config = self.bookie_config(host, metadata, extra, listen_any=listen_any, scheme=scheme)
        svc = self.popen(host, [sys.executable, "-m", "ledgerstore", "bookie", "--config", str(config)],
                         log=f"bookie-{host}.log", port=BOOKIE_PORT)
        if wait:
            self.wait_for(svc, " ready\n", 60.0)
        return svc

    def start_kafka(self, host: str, metadata: str, extra: str = "", timeout: float = 60.0) -> Service:
        """A Kafka front end (``ledgerstore kafka --config``) on ``host`` for the cluster at
        ``metadata``, listening on the host's address, port :data:`KAFKA_PORT`, and naming the
        host by its hostname in Metadata answers, so clients elsewhere connect by that name.
        ``extra``: more lines of its ``[kafka]`` table."""
        h = self.host(host)
        d = self.workdir / f"kafka-{h.name}"
        d.mkdir(parents=True, exist_ok=True)
        config = d / "kafka.toml"
        config.write_text(f'metadata = "{metadata}"\n[kafka]\nhost = "{h.address}"\nport = {KAFKA_PORT}\n'
                          f'advertised_host = "{h.hostname}"\n' + extra)
        svc = self.popen(host, [sys.executable, "-m", "ledgerstore", "kafka", "--config", str(config)],
                         log=f"kafka-{h.name}.log", port=KAFKA_PORT)
        self.wait_for(svc, "kafka ready on ", timeout)
        return svc

    def init_cluster(self, host: str, metadata: str) -> None:
        """Create the cluster's instance id in ``metadata``, from ``host``."""
        done = subprocess.run(self.command(host, [sys.executable, "-m", "ledgerstore", "shell", "--metadata", metadata,
                                                  "initnewcluster"]), capture_output=True, text=True, timeout=60)
        if done.returncode:
            raise NetnsError(f"initnewcluster on {host} failed: {done.stderr.strip() or done.stdout.strip()}")

    def make_certs(self, directory: str | Path, names: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
        """A throwaway CA (``directory/ca.pem``) and, for each host, a certificate and key naming
        its hostname and address. ``names`` maps a host to the hostname its certificate names
        instead (to test a mismatch). Returns host -> (cert file, key file)."""
        names = names or {}
        return issue_certs(directory, {
            h.name: (names[h.name], None) if h.name in names else (h.hostname, h.address) for h in self.hosts.values()
        })

    # --- partitions ---------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Silently partition ``host`` from every other: its port on the bridge goes down, its
        packets are dropped without a reset or an ICMP error."""
        link(self.bridge_ns, self.host(host), up=False)

    def link_up(self, host: str) -> None:
        """Undo :meth:`link_down`."""
        link(self.bridge_ns, self.host(host), up=True)

    def cut(self, host: str, others: Iterable[str]) -> None:
        """``host`` no longer exchanges packets with ``others`` (both ways, silently); replaces
        any earlier cut of ``host``. The others still reach everyone else."""
        cut(self.host(host), [self.host(o).address for o in others])

    def heal(self, host: str | None = None) -> None:
        """Undo every cut and link-down of ``host`` (of every host when ``None``)."""
        for h in [self.host(host)] if host else self.hosts.values():
            cut(h, [])
            link(self.bridge_ns, h, up=True)


def random_partitions(net: NetCluster, rnd: random.Random, victims: Sequence[str], peers: Sequence[str],
                      seconds: float) -> list[str]:
    """A randomized run of partitions for ``seconds``: at random moments one of ``victims`` goes
    silent (link down) or is cut off from a random non-empty subset of ``peers``, and is healed
    again before the next victim is chosen, so at most one victim is partitioned at a time. Every
    choice comes from ``rnd`` (seed it to replay a run). Returns what was done, in order; leaves
    everything healed."""
    done: list[str] = []
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            time.sleep(rnd.uniform(0.2, 1.0))
            victim = rnd.choice(list(victims))
            if rnd.random() < 0.5:
                net.link_down(victim)
                done.append(f"link down {victim}")
            else:
                others = [p for p in peers if p != victim]
                cut_from = rnd.sample(others, rnd.randint(1, len(others)))
                net.cut(victim, cut_from)
                done.append(f"cut {victim} from {','.join(sorted(cut_from))}")
            time.sleep(rnd.uniform(0.5, 3.0))
            net.heal(victim)
            done.append(f"heal {victim}")
    finally:
        net.heal()
    return done


def issue_certs(directory: str | Path, subjects: dict[str, tuple[str, str | None]]) -> dict[str, tuple[str, str]]:
    """A throwaway CA (``directory/ca.pem``, valid two days) and, for each ``key -> (DNS name,
    IP address or None)``, a certificate and key it signed naming them. Returns key -> (cert
    file, key file). Needs ``openssl``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        _run(["openssl", *args], check=True)

    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes")
    openssl("req", "-x509", *ec, "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"), "-days", "2",
            "-subj", "/CN=ledgerstore test CA", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    made = {}
    for key_name, (name, address) in subjects.items():
        ip = f",IP:{address}" if address else ""
        (d / f"{key_name}.ext").write_text(f"subjectAltName=DNS:{name}{ip}\nextendedKeyUsage=serverAuth,clientAuth\n")
        key, csr, pem = (str(d / f"{key_name}.{x}") for x in ("key", "csr", "pem"))
        openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", csr, "-CA", str(d / "ca.pem"), "-CAkey", str(d / "ca.key"),
                "-CAcreateserial", "-out", pem, "-days", "2", "-extfile", str(d / f"{key_name}.ext"))
        made[key_name] = (pem, key)
    return made


def link(bridge_ns: str, host: Host, up: bool) -> None:
    """Set ``host``'s port on the bridge up or down."""
    _run(["ip", "-n", bridge_ns, "link", "set", host.port, "up" if up else "down"])


def cut(host: Host, addresses: Sequence[str]) -> None:
    """Drop, inside ``host``'s namespace, every packet to or from ``addresses`` (none: heal)."""
    _run(["ip", "netns", "exec", host.netns, "nft", "delete", "table", "inet", _CUT_TABLE], check=False)
    if not addresses:
        return
    peers = ", ".join(addresses)
    rules = (
        f"table inet {_CUT_TABLE} {{\n"
        f"  chain input {{ type filter hook input priority 0; policy accept; ip saddr {{ {peers} }} drop; }}\n"
        f"  chain output {{ type filter hook output priority 0; policy accept; ip daddr {{ {peers} }} drop; }}\n"
        "}\n"
    )
    _run(["ip", "netns", "exec", host.netns, "nft", "-f", "-"], stdin=rules)


def _stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        pass


def _pids_in(netns: str) -> list[int]:
    done = _run(["ip", "netns", "pids", netns], check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def remove_cluster(tag: str, namespaces: Sequence[str] | None = None) -> None:
    """Remove the namespaces of cluster ``tag`` (the ones named, or those its state file lists),
    SIGKILL any process still inside them, and remove their ``/etc/netns`` directories and the
    state file. Idempotent."""
    state_file = STATE_DIR / f"{tag}.json"
    if namespaces is None:
        try:
            state = json.loads(state_file.read_text())
        except (OSError, ValueError) as exc:
            raise NetnsError(f"no cluster {tag!r}: cannot read {state_file}: {exc}") from None
        namespaces = [h["netns"] for h in state["hosts"].values()] + [state["bridge_ns"]]
    for ns in namespaces:
        for pid in _pids_in(ns):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _run(["ip", "netns", "del", ns], check=False)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
    state_file.unlink(missing_ok=True)


@dataclasses.dataclass
class AttachedCluster:
    """A running cluster found by its tag (from another process): partitions only."""

    tag: str
    bridge_ns: str
    hosts: dict[str, Host]

    def host(self, name: str) -> Host:
        """The host called ``name``."""
        try:
            return self.hosts[name]
        except KeyError:
            raise NetnsError(f"cluster {self.tag} has no host {name!r}; hosts: {', '.join(self.hosts)}") from None


def attach(tag: str) -> AttachedCluster:
    """The cluster ``tag`` another process made (read from its state file)."""
    path = STATE_DIR / f"{tag}.json"
    try:
        state = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NetnsError(f"no cluster {tag!r}: cannot read {path}: {exc}") from None
    return AttachedCluster(tag, state["bridge_ns"], {n: Host(**h) for n, h in state["hosts"].items()})


# --- pytest ----------------------------------------------------------------------------------


def require_netns() -> None:
    """Skip the calling test, in one line, when namespaces cannot be made here."""
    why = netns_unavailable()
    if why:
        pytest.skip(f"multi-host tests need network namespaces: {why}")


@pytest.fixture
def net_cluster_factory(tmp_path: Path) -> Iterator[type[NetCluster]]:
    """Build :class:`NetCluster`s closed when the test ends, passed or failed."""
    require_netns()
    made: list[NetCluster] = []

    class _Tracked(NetCluster):
        def __init__(self, hosts: Sequence[str], subnet: str | None = None, workdir: str | Path | None = None,
                     domain: str = "cluster.test") -> None:
            super().__init__(hosts, subnet, workdir or tmp_path / f"net{len(made)}", domain)
            made.append(self)

    try:
        yield _Tracked
    finally:
        for c in made:
            c.close()

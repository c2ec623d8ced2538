"""A cluster across hosts for the multi-host tests: etcd on host ``meta``, bookies on ``b1``..``b5``
(racks from a topology file: ``b1 b2`` on /dc1/r1, ``b3 b4`` on /dc1/r2, ``b5`` on /dc1/r3), and
client hosts ``c1`` and ``c2``, each its own network namespace on one bridge. Clients are
:mod:`tests.multihost.agent` processes run inside a client host. Every test leaves the network
healed; the cluster is removed when the module ends, passed or failed."""

from __future__ import annotations

import contextlib
import json
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ledgerstore.testing.netns import NetCluster, Service, net_cluster_factory, require_netns

__all__ = ["Agent", "MultiHost", "cluster_hosts", "host_of", "net_cluster_factory", "start_bookies"]

AGENT = str(Path(__file__).with_name("agent.py"))
BOOKIES = ["b1", "b2", "b3", "b4", "b5"]
RACKS = {"b1": "/dc1/r1", "b2": "/dc1/r1", "b3": "/dc1/r2", "b4": "/dc1/r2", "b5": "/dc1/r3"}
#: the clients' add timeout: a silent bookie must be replaced within a bound tied to it
ADD_TIMEOUT_S = 2.0
#: etcd lease of every process: a silent host's registration lapses after this
LEASE_TTL_S = 3
#: deadline of one metadata request: a client cut off from etcd gives up on a request after it
METADATA_TIMEOUT_S = 5.0
#: how long a client's metadata reads retry across an outage (metadata_read_retry_s; 30 s by default)
METADATA_READ_RETRY_S = 3.0


class Agent:
    """A client process on a test host, driven one JSON command at a time."""

    def __init__(self, net: NetCluster, host: str, metadata: str, **options: Any) -> None:
        options.setdefault("add_timeout_s", ADD_TIMEOUT_S)
        options.setdefault("metadata_read_retry_s", METADATA_READ_RETRY_S)
        options.setdefault("metadata_options", {"session_timeout": LEASE_TTL_S,
                                                "operation_timeout": METADATA_TIMEOUT_S})
        self.host = host
        self.svc: Service = net.popen(host, [sys.executable, AGENT, metadata, json.dumps(options)],
                                      log=f"agent-{host}-{time.monotonic_ns()}.log",
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next(60).get("ready"), "the agent did not start"

    def _read(self) -> None:
        assert self.svc.proc.stdout is not None
        for line in self.svc.proc.stdout:
            self._lines.put(line.decode())
        self._lines.put("")

    def _next(self, timeout: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"agent on {self.host} did not answer within {timeout}s") from None
        if not line:
            raise AssertionError(f"agent on {self.host} exited: {self.svc.log_text()[-2000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, op: str, **args: Any) -> None:
        """Send a command without waiting for its answer (see :meth:`answer`)."""
        assert self.svc.proc.stdin is not None
        self.svc.proc.stdin.write((json.dumps({"op": op, **args}) + "\n").encode())
        self.svc.proc.stdin.flush()

    def answer(self, timeout: float = 90.0) -> dict[str, Any]:
        """The answer to the oldest command not yet answered."""
        return self._next(timeout)

    def ask(self, op: str, timeout: float = 90.0, **args: Any) -> dict[str, Any]:
        """Send a command and wait for its answer."""
        self.send(op, **args)
        return self.answer(timeout)


def host_of(bookie_id: str) -> str:
    """``b3`` for bookie id ``b3.cluster.test:3181``."""
    return bookie_id.split(".", 1)[0]


class MultiHost:
    """The running cluster: the network, the metadata URI and the topology file."""

    def __init__(self, net: NetCluster, metadata: str, topology: Path, **agent_options: Any) -> None:
        self.net = net
        self.metadata = metadata
        self.topology = topology
        #: client options every agent of this cluster starts with (a test's own win)
        self.agent_options = agent_options
        self.agents: list[Agent] = []

    def agent(self, host: str, **options: Any) -> Agent:
        """A client process on ``host`` (stopped when the test ends)."""
        agent = Agent(self.net, host, self.metadata, **{**self.agent_options, **options})
        self.agents.append(agent)
        return agent

    def wait_bookies(self, agent: Agent, n: int = len(BOOKIES), timeout: float = 30.0) -> None:
        """Wait until ``n`` bookies are registered, as ``agent`` sees it."""
        deadline = time.monotonic() + timeout
        while len(agent.ask("bookies")["bookies"]) < n:
            assert time.monotonic() < deadline, f"fewer than {n} bookies registered after {timeout}s"
            time.sleep(0.3)


@contextlib.contextmanager
def cluster_hosts(tmp_path_factory: pytest.TempPathFactory, name: str, bookies: list[str]) -> Iterator[NetCluster]:
    """A started network of hosts ``meta``, ``bookies``, ``c1`` and ``c2``, removed on exit
    (skips the module without namespaces)."""
    require_netns()
    net = NetCluster(["meta", *bookies, "c1", "c2"], workdir=tmp_path_factory.mktemp(name))
    try:
        yield net.start()
    finally:
        net.close()


def start_bookies(net: NetCluster, bookies: list[str], metadata: str, extra: str) -> None:
    """Start a bookie on each host of ``bookies`` at once and wait until all are ready."""
    services = [net.start_bookie(b, metadata, extra, wait=False) for b in bookies]
    for svc in services:
        net.wait_for(svc, " ready\n", 60.0)


@pytest.fixture(scope="module")
def multihost(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MultiHost]:
    """The cluster of this module's docstring, built once per test module."""
    with cluster_hosts(tmp_path_factory, "multihost", BOOKIES) as net:
        topology = net.workdir / "topology.txt"
        topology.write_text("".join(f"{net.host(b).hostname} {rack}\n" for b, rack in RACKS.items()))
        metadata = net.start_etcd("meta").uri("/ledgers")
        net.init_cluster("c1", metadata)
        extra = (
            f"metadata_options = {{ lease_ttl = {LEASE_TTL_S} }}\n"
            "[bookie.autorecovery]\n"
            "enabled = true\n"
            "lost_bookie_recovery_delay_s = 0\n"
            "lease_s = 5\n"
            'placement = "rack-aware"\n'
            f'placement_options = {{ topology_file = "{topology}" }}\n'
        )
        start_bookies(net, BOOKIES, metadata, extra)
        yield MultiHost(net, metadata, topology)


@pytest.fixture
def cluster(multihost: MultiHost) -> Iterator[MultiHost]:
    """The module's cluster; the network is healed after the test, whatever happened."""
    try:
        yield multihost
    finally:
        multihost.net.heal()
        for agent in multihost.agents:
            multihost.net.stop(agent.svc)
        multihost.agents.clear()

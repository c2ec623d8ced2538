"""Shared fixtures: real bookie processes on free 127.0.0.1 ports, stopped by PID; real ZooKeeper
and etcd servers (session-scoped, started only when a test needs them)."""

from __future__ import annotations

import os
import signal
import threading
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from ledgerstore.cluster import LocalCluster
from tests import background

os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")

pytest_plugins = ["ledgerstore.testing.servers"]


class ClusterConfig(NamedTuple):
    metadata: str  # sqlite | zk | etcd
    storage: str  # entrylog | rocksdb
    transport: str  # tcp | zmq

    @property
    def id(self) -> str:
        return f"{self.metadata}-{self.storage}-{self.transport}"


DEFAULT = ClusterConfig("sqlite", "entrylog", "tcp")
#: The whole-cluster suite runs on the defaults and then varies one backend at a time.
MATRIX = [
    DEFAULT,
    ClusterConfig("zk", "entrylog", "tcp"),
    ClusterConfig("etcd", "entrylog", "tcp"),
    ClusterConfig("sqlite", "rocksdb", "tcp"),
    ClusterConfig("sqlite", "entrylog", "zmq"),
]


def _metadata_uri(request: pytest.FixtureRequest, backend: str) -> str | None:
    root = f"/c-{uuid.uuid4().hex[:12]}"
    if backend == "zk":
        return str(request.getfixturevalue("zookeeper_server").uri(root))
    if backend == "etcd":
        return str(request.getfixturevalue("etcd_server").uri(root))
    return None  # sqlite: a file in the cluster's directory


def make_cluster(request: pytest.FixtureRequest, tmp: Path, bookies: int, config: ClusterConfig = DEFAULT,
                 **kw: object) -> LocalCluster:
    opts: dict[str, object] = {"storage": config.storage, "transport": config.transport,
                               "metadata": _metadata_uri(request, config.metadata)}
    opts.update(kw)  # a test may pin one backend, e.g. transport="zmq"
    return LocalCluster(tmp, bookies=bookies, port_base=None, **opts)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three bookies (default backends) shared by the tests of a module that do not kill anything."""
    cluster = make_cluster(request, tmp_path_factory.mktemp("cluster"), 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Build private clusters (default backends) for tests that kill or restart bookies."""
    made: list[LocalCluster] = []

    def factory(bookies: int = 3, config: ClusterConfig = DEFAULT, **kw: object) -> LocalCluster:
        c = make_cluster(request, tmp_path / f"c{len(made)}", bookies, config, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.stop()


@pytest.fixture(scope="module", params=MATRIX, ids=[c.id for c in MATRIX])
def cluster_config(request: pytest.FixtureRequest) -> ClusterConfig:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def matrix_cluster(request: pytest.FixtureRequest, cluster_config: ClusterConfig,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three bookies, once per backend combination of MATRIX."""
    cluster = make_cluster(request, tmp_path_factory.mktemp(cluster_config.id), 3, cluster_config)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def matrix_cluster_factory(request: pytest.FixtureRequest, cluster_config: ClusterConfig,
                           tmp_path: Path) -> Iterator[Callable[..., LocalCluster]]:
    """Private clusters, once per backend combination of MATRIX."""
    made: list[LocalCluster] = []

    def factory(bookies: int = 3, **kw: object) -> LocalCluster:
        c = make_cluster(request, tmp_path / f"c{len(made)}", bookies, cluster_config, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.stop()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[int], Path]]:
    """Mount small file systems of the test's own (tmpfs of a given size in MiB; mounting needs
    root), each unmounted afterwards: a disk that fills up for real."""
    import subprocess

    mounted: list[Path] = []

    def mount(size_mib: int) -> Path:
        mnt = tmp_path / f"tmpfs-{len(mounted)}"
        mnt.mkdir()
        out = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mnt)],
                             capture_output=True, text=True)
        assert out.returncode == 0, f"this test mounts a small tmpfs and needs root: {out.stderr}"
        mounted.append(mnt)
        return mnt

    yield mount
    for mnt in mounted:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.fixture(autouse=True)
def _sigint_stays_keyboard_interrupt(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that leaves another SIGINT handler installed (or SIGINT blocked) in this process
    would change what Ctrl-C does in every later test: put the default back and say which test
    left it."""
    yield
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        warnings.warn(f"{request.node.nodeid} left SIGINT handled by {signal.getsignal(signal.SIGINT)!r}; "
                      "restored the default", stacklevel=1)
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
        warnings.warn(f"{request.node.nodeid} left SIGINT blocked; unblocked it", stacklevel=1)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


#: the simulation's seeds in every CI run (tests/sim/test_simulation.py): CPU-bound and in memory,
#: started in the background at nice 19 once collected (tests/background.py). The benchmarks'
#: shape check (tests/test_benchmarks_smoke.py) runs when its test asks for it: its bookies fsync,
#: and beside the suite's own servers that disk traffic cost the others more than it saved.
SIM_CI_SEEDS = 300
background.define("sim-ci", ["tests/sim/test_simulation.py::test_every_invariant_holds"],
                  [background.python(), "-m", "ledgerstore", "sim", "--seeds", str(SIM_CI_SEEDS), "--bookies", "5",
                   "--duration", "30", "--jobs", "1"], timeout=1800)
BENCH_TINY_OUT = background.SCRATCH / "bench-tiny"
background.define("bench-tiny", [],
                  [background.python(), "benchmarks/run_all.py", "--tiny", "--json-out", str(BENCH_TINY_OUT / "r.json"),
                   "--md-out", str(BENCH_TINY_OUT / "r.md")], timeout=1200)


def pytest_sessionstart(session: pytest.Session) -> None:
    # A shell without job control starts its background commands with SIGINT ignored, and Python
    # then keeps it ignored: the tests of what Ctrl-C does need Python's own handler
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_finish(session: pytest.Session) -> None:
    if not background.is_worker():  # under pytest-xdist the controller starts them (below)
        background.start_needed([item.nodeid for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    """pytest-xdist's controller: a worker collected the suite (each collects all of it)."""
    background.start_needed(ids)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    background.stop_all()

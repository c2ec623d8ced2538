"""Shared fixtures: real bookie processes on free 127.0.0.1 ports, stopped by PID."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from ledgerstore.cluster import LocalCluster

os.environ.setdefault("JAVA_HOME", "/usr/lib/jvm/java-17-openjdk-amd64")


def make_cluster(tmp: Path, bookies: int = 3, **kw: object) -> LocalCluster:
    return LocalCluster(tmp, bookies=bookies, port_base=None, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """Three bookies shared by the tests of a module that do not kill anything."""
    cluster = make_cluster(tmp_path_factory.mktemp("cluster"), 3)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[object]:
    """Build private clusters for tests that kill or restart bookies; all stopped at the end."""
    made: list[LocalCluster] = []

    def factory(bookies: int = 3, **kw: object) -> LocalCluster:
        c = make_cluster(tmp_path / f"c{len(made)}", bookies, **kw)
        made.append(c)
        return c

    yield factory
    for c in made:
        c.stop()

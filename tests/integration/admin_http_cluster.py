"""Bookie processes with admin HTTP servers on free ports, for the admin API and metrics tests."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from ledgerstore.cluster import LocalCluster, free_ports


def listening(port: int) -> bool:
    """Something accepts connections on ``127.0.0.1:port``."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def start_http_cluster(path: Path, bookies: int, token: str,
                       extra: Callable[[int], str] = lambda i: "") -> tuple[LocalCluster, list[int]]:
    """Start ``bookies`` bookie processes under ``path``, each with its admin HTTP server on its
    own free port and ``token`` as the admin token (plus ``extra(i)`` appended to bookie i's
    config), and return the cluster and the ports once every port listens. The caller stops it."""
    cluster = LocalCluster(path, bookies=bookies, port_base=None)
    cluster.data_dir.mkdir(parents=True, exist_ok=True)
    cluster.write_configs()
    ports = free_ports(bookies)
    token_file = cluster.data_dir / "admin-token"
    token_file.write_text(token + "\n")
    for i, port in enumerate(ports):  # each bookie needs its own admin port: append to its own file
        with open(cluster.config_path(i), "a") as fh:
            fh.write(f'http_port = {port}\n[bookie.http]\ntoken_file = "{token_file}"\n{extra(i)}')
    cluster.start()
    try:
        # a bookie registers just before its admin server listens: wait for the ports too
        deadline = time.monotonic() + 30
        for port in ports:
            while not listening(port):
                assert time.monotonic() < deadline, f"the admin port {port} does not listen"
                time.sleep(0.05)
    except BaseException:
        cluster.stop()
        raise
    return cluster, ports

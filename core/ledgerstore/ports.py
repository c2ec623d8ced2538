"""Free TCP ports on 127.0.0.1 for local clusters, ``standalone --port-base 0`` and the test harness.

A port is chosen now and bound later by another process (a bookie reads it from its config file),
so two rules keep the pick from colliding with what binds in between:

- **Below the kernel's ephemeral range.** Outgoing connections take their local ports from
  ``/proc/sys/net/ipv4/ip_local_port_range``; a bookie restarted on its port must not find it
  taken by one of them, as a port the OS picked with ``bind(0)`` could be.
- **One slice per test worker.** When the test suite runs in several pytest-xdist workers at once
  (``PYTEST_XDIST_WORKER=gwN``, ``PYTEST_XDIST_WORKER_COUNT=K``; both are inherited by the bookie
  and CLI processes a test starts), worker ``N`` picks only from the ``N``-th of ``K`` equal
  slices of the range, so two workers never hand out the same port. Within one process the last
  ports handed out are not handed out again, so two picks made before either is bound differ.
"""

from __future__ import annotations

import collections
import os
import random
import socket

from ledgerstore.errors import LedgerStoreError

__all__ = ["consecutive_free_ports", "free_ports", "port_range"]

#: lowest port ever picked when the ephemeral range starts high enough (it leaves the well-known
#: and common service ports below it alone)
_LOW = 10_000
#: ports handed out by this process recently: not handed out again before they had time to be bound
_recent: collections.deque[int] = collections.deque(maxlen=512)


def _ephemeral_start() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _worker_slice() -> tuple[int, int]:
    """``(index, count)`` of this pytest-xdist worker, ``(0, 1)`` outside one."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if worker.startswith("gw") and worker[2:].isdigit() and count.isdigit() and int(count) > 0:
        return int(worker[2:]) % int(count), int(count)
    return 0, 1


def port_range() -> tuple[int, int]:
    """``(low, high)``: this process picks ports in ``range(low, high)``, below the ephemeral
    range and inside its test worker's slice (see the module docstring)."""
    ephemeral = _ephemeral_start()
    low = _LOW if ephemeral > _LOW + 2_000 else 1_024
    index, count = _worker_slice()
    width = (ephemeral - low) // count
    return low + index * width, low + (index + 1) * width


def _bindable(ports: range) -> bool:
    socks: list[socket.socket] = []
    try:
        for port in ports:
            s = socket.socket()
            socks.append(s)
            s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        for s in socks:
            s.close()


def consecutive_free_ports(n: int) -> int:
    """The first of ``n`` consecutive ports free on 127.0.0.1 right now (``--port-base`` numbers
    bookies by port)."""
    low, high = port_range()
    rnd = random.SystemRandom()
    for _ in range(200):
        base = rnd.randrange(low, high - n)
        block = range(base, base + n)
        if any(p in _recent for p in block) or not _bindable(block):
            continue
        _recent.extend(block)
        return base
    raise LedgerStoreError(f"could not find {n} consecutive free ports between {low} and {high}")


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports free on 127.0.0.1 right now, chosen as the module docstring says."""
    low, high = port_range()
    rnd = random.SystemRandom()
    ports: list[int] = []
    for _ in range(20 * n + 200):
        if len(ports) == n:
            break
        port = rnd.randrange(low, high)
        if port in ports or port in _recent or not _bindable(range(port, port + 1)):
            continue
        ports.append(port)
    if len(ports) < n:
        raise LedgerStoreError(f"could not find {n} free ports between {low} and {high}")
    _recent.extend(ports)
    return ports

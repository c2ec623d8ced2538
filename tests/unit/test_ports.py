"""Free ports for local clusters and test servers: below the ephemeral range, one slice per
pytest-xdist worker, never handed out twice in a row by one process."""

from __future__ import annotations

import socket

import pytest

from ledgerstore.ports import consecutive_free_ports, free_ports, port_range


def _ephemeral_start() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        return int(fh.read().split()[0])


def test_ports_are_picked_below_the_ephemeral_range(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_XDIST_WORKER_COUNT", raising=False)
    low, high = port_range()
    assert 1024 <= low < high <= _ephemeral_start()
    assert all(low <= p < high for p in free_ports(50))


def test_two_workers_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    slices = []
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        low, high = port_range()
        slices.append(range(low, high))
        picked = free_ports(30)
        assert all(p in slices[-1] for p in picked), (worker, picked)
        base = consecutive_free_ports(4)
        assert base in slices[-1] and base + 3 in slices[-1]
    assert slices[0].stop <= slices[1].start, slices
    assert len(slices[0]) == len(slices[1]) > 5_000


def test_a_port_handed_out_is_not_handed_out_again_before_it_is_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    # 600 workers leave each a slice of about 37 ports: a repeat among 20 picks would be all but
    # certain if the process did not remember what it handed out
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "600")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw599")
    low, high = port_range()
    assert high - low < 60
    picked = [p for _ in range(10) for p in free_ports(2)]
    assert len(set(picked)) == len(picked) == 20


def test_the_ports_are_free_when_handed_out() -> None:
    for port in free_ports(5):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))

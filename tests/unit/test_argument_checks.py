"""Bad input to the public API and to configuration is refused up front with an error that names
what was wrong: every duration option has an upper bound (config files and plugin options), and
the client's public methods, sync and async alike, raise InvalidArgumentError naming the
argument, never a bare TypeError from deep inside."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import ledgerstore
from ledgerstore.aio import Client as AsyncClient
from ledgerstore.api import MAX_DURATION_S, check_options
from ledgerstore.config import BookieConfig, ClientConfig
from ledgerstore.errors import InvalidArgumentError
from ledgerstore.meta.bookies import ClusterManager
from ledgerstore_memory import MemoryMetadataStore
from ledgerstore_tcp import TcpTransport
from ledgerstore_zmq import ZmqTransport

HUGE = 99999999999999999999

#: (method, args, kwargs, the argument the error must name)
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], str]] = [
    ("open_ledger", ("abc",), {}, "ledger_id"),
    ("open_ledger", (-1,), {}, "ledger_id"),
    ("open_ledger", (2**63,), {}, "ledger_id"),
    ("open_ledger", (True,), {}, "ledger_id"),
    ("open_ledger", (1.5,), {}, "ledger_id"),
    ("open_ledger", (1,), {"password": "text"}, "password"),
    ("open_ledger", (1,), {"recovery": "yes"}, "recovery"),
    ("delete_ledger", ("1",), {}, "ledger_id"),
    ("ledger_metadata", (None,), {}, "ledger_id"),
    ("create_ledger", ("3",), {}, "ensemble"),
    ("create_ledger", (3, 2.0), {}, "write_quorum"),
    ("create_ledger", (3, 2, 0), {}, "ack_quorum"),
    ("create_ledger", (), {"digest": 32}, "digest"),
    ("create_ledger", (), {"password": None}, "password"),
    ("create_ledger", (), {"custom_metadata": {"k": 1}}, "custom_metadata"),
    ("create_ledger", (), {"bookies": "127.0.0.1:3181"}, "bookies"),
    ("open_log", (42,), {}, "name"),
    ("open_log", ("",), {}, "name"),
    ("open_log", ("orders",), {"roll_size_bytes": "1MB"}, "roll_size_bytes"),
    ("open_log", ("orders",), {"roll_interval_s": -1}, "roll_interval_s"),
    ("open_log_reader", ("orders",), {"batch_size": 0}, "batch_size"),
    ("open_log_reader", ("orders",), {"poll_interval_s": "fast"}, "poll_interval_s"),
    ("open_log_reader", ("orders",), {"follow": 1}, "follow"),
    ("delete_log", (None,), {}, "name"),
    ("truncate_log", (b"orders", "earliest"), {}, "name"),
]


async def _cluster_uri() -> str:
    """A fresh in-memory metadata store holding a cluster (a client joins only an existing one)."""
    uri = f"memory://arguments-{uuid.uuid4().hex}"
    store = MemoryMetadataStore(uri)
    await store.start()
    try:
        await ClusterManager(store).init()
    finally:
        await store.close()
    return uri


def _uri() -> str:
    return asyncio.run(_cluster_uri())


@pytest.mark.parametrize(("method", "args", "kwargs", "named"), BAD_CALLS,
                         ids=[f"{m}-{n}-{i}" for i, (m, _, _, n) in enumerate(BAD_CALLS)])
def test_the_async_client_names_the_bad_argument(method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                                                  named: str) -> None:
    async def call() -> None:
        async with AsyncClient(metadata=await _cluster_uri()) as client:
            with pytest.raises(InvalidArgumentError, match=rf"^{named}\b"):
                await getattr(client, method)(*args, **kwargs)

    asyncio.run(call())


@pytest.mark.parametrize(("method", "args", "kwargs", "named"), BAD_CALLS[:10],
                         ids=[f"{m}-{n}-{i}" for i, (m, _, _, n) in enumerate(BAD_CALLS[:10])])
def test_the_sync_client_names_the_bad_argument(method: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                                                 named: str) -> None:
    with ledgerstore.Client(metadata=_uri()) as client:
        with pytest.raises(InvalidArgumentError, match=rf"^{named}\b"):
            getattr(client, method)(*args, **kwargs)


def test_a_text_password_says_how_to_encode_it() -> None:
    with ledgerstore.Client(metadata=_uri()) as client:
        with pytest.raises(InvalidArgumentError, match=r"password must be bytes, not str; encode it"):
            client.open_ledger(1, password="pw")


@pytest.mark.parametrize("make", [
    lambda: BookieConfig(metadata="sqlite:///tmp/x.db", flush_interval_ms=HUGE),
    lambda: BookieConfig(metadata="sqlite:///tmp/x.db", idle_connection_timeout_s=float("inf")),
    lambda: BookieConfig(metadata="sqlite:///tmp/x.db", gc_wait_time_ms=float("nan")),
    lambda: BookieConfig(metadata="sqlite:///tmp/x.db", metadata_start_retry_s=HUGE),
    lambda: ClientConfig(metadata="sqlite:///tmp/x.db", add_timeout_s=HUGE),
    lambda: ClientConfig(metadata="sqlite:///tmp/x.db", speculative_read_timeout_ms=HUGE),
])
def test_every_duration_has_an_upper_bound(make: Callable[[], BookieConfig | ClientConfig]) -> None:
    problems = make().validate()
    assert len(problems) == 1 and "is too long: at most" in problems[0], problems


def test_nested_durations_are_bounded_and_rates_are_not_durations() -> None:
    cfg = BookieConfig(metadata="sqlite:///tmp/x.db")
    cfg.autorecovery.audit_interval_s = HUGE
    cfg.journal.max_group_wait_ms = HUGE
    cfg.autorecovery.rereplication_entries_per_s = HUGE  # a rate: any size is a choice, not a typo
    assert sorted(p.split(" = ")[0] for p in cfg.validate()) == [
        "'autorecovery.audit_interval_s'", "'journal.max_group_wait_ms'"]
    assert BookieConfig(metadata="sqlite:///tmp/x.db").validate() == []  # the defaults are within bounds


def test_plugin_duration_options_are_bounded() -> None:
    problems = [*check_options(ZmqTransport.Options, {"heartbeat_interval": HUGE}, "transport plugin 'zmq'"),
                *check_options(TcpTransport.Options, {"connect_timeout": float("nan")}, "transport plugin 'tcp'")]
    assert len(problems) == 2 and all("out of range" in p for p in problems), problems
    assert check_options(TcpTransport.Options, {"connect_timeout": MAX_DURATION_S}, "tcp") == []


def test_config_check_and_bookie_start_refuse_a_huge_interval(tmp_path: Path) -> None:
    cfg = tmp_path / "bookie.toml"
    cfg.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path}/meta.db"\njournal_dir = "{tmp_path}/journal"\n'
                   f'ledger_dirs = ["{tmp_path}/ledgers"]\ndisk_check_interval_ms = {HUGE}\n'
                   f'[bookie.transport]\nconnect_timeout = 1e30\n')
    for command in (["config", "check", str(cfg)], ["bookie", "--config", str(cfg)]):
        out = subprocess.run([sys.executable, "-m", "ledgerstore", *command], capture_output=True, text=True,
                             timeout=120)
        assert out.returncode != 0, out
        assert "Traceback" not in out.stderr + out.stdout
        assert f"'disk_check_interval_ms' = {HUGE} is too long" in out.stderr + out.stdout
    assert not (tmp_path / "journal").exists()  # nothing was started


def test_one_config_problem_is_one_line(tmp_path: Path) -> None:
    """An operator's one mistake is one line on stderr, naming the file and the option."""
    cfg = tmp_path / "bookie.toml"
    cfg.write_text(f'[bookie]\nmetadata = "sqlite://{tmp_path}/meta.db"\njournal_dir = "{tmp_path}/journal"\n'
                   f'ledger_dirs = ["{tmp_path}/ledgers"]\nflush_interval_ms = {HUGE}\n')
    out = subprocess.run([sys.executable, "-m", "ledgerstore", "config", "check", str(cfg)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2, out
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(cfg) in lines[0] and f"'flush_interval_ms' = {HUGE} is too long" in lines[0], lines

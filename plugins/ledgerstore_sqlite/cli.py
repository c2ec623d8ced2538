"""``ledgerstore metadata-server``: serve one sqlite metadata database over a Unix socket and,
with ``--listen``, over TCP to other hosts (with a shared secret)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import click

import ledgerstore
from ledgerstore.bookie.server import watch_supervisor
from ledgerstore.cli.common import handle_errors, setup_logging
from ledgerstore.errors import ConfigError
from ledgerstore.startup import SUPERVISOR_PID_ENV
from ledgerstore_sqlite.auth import read_secret
from ledgerstore_sqlite.discovery import format_address, parse_address
from ledgerstore_sqlite.server import AUTH_TIMEOUT_S, MAX_UNAUTHENTICATED, MetadataServer
from ledgerstore_sqlite.store import path_from_uri
from ledgerstore_sqlite.tls import server_context

__all__ = ["metadata_server"]


async def _run(server: MetadataServer) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # The line supervisors (LocalCluster) wait for.
    tcp = "" if server.tcp_address is None else f" and tcp {format_address(*server.tcp_address)}"
    tcp += " (TLS)" if server.tcp_address is not None and server.tls is not None else ""
    print(f"metadata server for {server.db_path} ready on {server.socket_path}{tcp}", flush=True)
    waiters: set[asyncio.Task[Any]] = {loop.create_task(stop.wait())}
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    if supervisor.isdigit():  # started by ``ledgerstore standalone``: die with it
        waiters.add(loop.create_task(watch_supervisor(int(supervisor), stop)))
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waiters:
            task.cancel()
        await server.close()


@click.command("metadata-server")
@click.option("--db", "db", required=True,
              help="the database file (a path, or a sqlite:// metadata URI); created if absent")
@click.option("--reap-interval", default=0.25, show_default=True, type=click.FloatRange(min=0.01),
              help="seconds between sweeps that end expired client sessions")
@click.option("--synchronous", default="full", show_default=True, type=click.Choice(["full", "normal"]))
@click.option("--listen", "listen", default=None, metavar="HOST:PORT",
              help="also serve TCP on this address, for bookies and clients on other hosts "
                   "(port 0: a free one, printed when ready); needs --secret-file")
@click.option("--listen-any", is_flag=True, help="allow --listen on a wildcard address (0.0.0.0, [::])")
@click.option("--secret-file", default=None, metavar="PATH",
              help="file holding the secret every TCP client proves it knows (mode 0600 or stricter)")
@click.option("--auth-timeout", default=AUTH_TIMEOUT_S, show_default=True, type=click.FloatRange(min=0.01),
              help="seconds a TCP connection has to authenticate before it is closed")
@click.option("--max-unauthenticated", default=MAX_UNAUTHENTICATED, show_default=True,
              type=click.IntRange(min=1), help="TCP connections allowed to be authenticating at once")
@click.option("--tls-cert-file", default=None, metavar="PEM",
              help="serve TCP inside TLS with this certificate chain (with --tls-key-file)")
@click.option("--tls-key-file", default=None, metavar="PEM", help="the private key of --tls-cert-file")
@click.option("--log-level", default="INFO", show_default=True)
@handle_errors
def metadata_server(db: str, reap_interval: float, synchronous: str, listen: str | None, listen_any: bool,
                    secret_file: str | None, auth_timeout: float, max_unauthenticated: int,
                    tls_cert_file: str | None, tls_key_file: str | None, log_level: str) -> None:
    """Serve a sqlite metadata database to every process of this machine over a Unix socket
    (<db>.sock), so no client holds the file's lock: one paused process cannot stop the others.
    Clients configured with sqlite://<db> find it by themselves. With --listen, processes on
    other hosts reach it as sqlite+tcp://HOST:PORT, each proving the secret of --secret-file.
    Stops on SIGTERM or Ctrl-C."""
    setup_logging(log_level)
    path = path_from_uri(db) if db.startswith("sqlite://") else os.path.abspath(db)
    if secret_file is not None and listen is None:
        raise ConfigError("--secret-file is for the TCP listener; give --listen HOST:PORT too")
    if (tls_cert_file is None) != (tls_key_file is None):
        raise ConfigError("--tls-cert-file and --tls-key-file go together: give both or neither")
    if tls_cert_file is not None and listen is None:
        raise ConfigError("--tls-cert-file is for the TCP listener; give --listen HOST:PORT too")
    tls = None if tls_cert_file is None or tls_key_file is None else server_context(tls_cert_file, tls_key_file)
    address = None if listen is None else parse_address(listen, "--listen")
    secret = None if secret_file is None else read_secret(secret_file, "--secret-file")
    server = MetadataServer(path, reap_interval=reap_interval, synchronous=synchronous, listen=address,
                            secret=secret, listen_any=listen_any, auth_timeout=auth_timeout,
                            max_unauthenticated=max_unauthenticated, tls=tls)
    asyncio.run(_run(server))


@ledgerstore.hookimpl
def ledgerstore_cli_commands() -> list[click.Command]:
    """``ledgerstore metadata-server`` is this plugin's (registered through its entry point)."""
    return [metadata_server]

"""``ledgerstore metadata-server``: serve one sqlite metadata database over a Unix socket."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import click

import ledgerstore
from ledgerstore.bookie.server import watch_supervisor
from ledgerstore.cli.common import handle_errors, setup_logging
from ledgerstore.startup import SUPERVISOR_PID_ENV
from ledgerstore_sqlite.server import MetadataServer
from ledgerstore_sqlite.store import path_from_uri

__all__ = ["metadata_server"]


async def _run(server: MetadataServer) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await server.start()
    # The line supervisors (LocalCluster) wait for.
    print(f"metadata server for {server.db_path} ready on {server.socket_path}", flush=True)
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
@click.option("--log-level", default="INFO", show_default=True)
@handle_errors
def metadata_server(db: str, reap_interval: float, synchronous: str, log_level: str) -> None:
    """Serve a sqlite metadata database to every process of this machine over a Unix socket
    (<db>.sock), so no client holds the file's lock: one paused process cannot stop the others.
    Clients configured with sqlite://<db> find it by themselves. Stops on SIGTERM or Ctrl-C."""
    setup_logging(log_level)
    path = path_from_uri(db) if db.startswith("sqlite://") else os.path.abspath(db)
    asyncio.run(_run(MetadataServer(path, reap_interval=reap_interval, synchronous=synchronous)))


@ledgerstore.hookimpl
def ledgerstore_cli_commands() -> list[click.Command]:
    """``ledgerstore metadata-server`` is this plugin's (registered through its entry point)."""
    return [metadata_server]

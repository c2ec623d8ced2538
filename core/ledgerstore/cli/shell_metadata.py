"""``shell metadata-export``, ``metadata-import`` and ``metadata-copy``: a whole cluster's metadata
to a backup file, from one, and between two stores of any backends (sqlite, ZooKeeper, etcd).

BookKeeper has no such tool. Offline only: each command refuses while a bookie or an
auto-recovery process is registered at the source (or the target), refuses a target that holds any
key, and after writing reads the target back (same keys, same bytes, same layout version, the
ledger id counter past the source's). The snapshot itself is :mod:`ledgerstore.meta.transfer`;
this module only opens the stores and prints one line (or ``--json``).
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ledgerstore.api import MetadataStore
from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.cli.shell_context import is_bookie_config
from ledgerstore.cli.shell_ledger_files import write_private
from ledgerstore.cli.shell_local import json_option
from ledgerstore.config import load_bookie_config, load_client_config
from ledgerstore.errors import ConfigError
from ledgerstore.meta import layout
from ledgerstore.meta.cluster_check import refuse_missing_sqlite_file
from ledgerstore.meta.transfer import (
    Snapshot,
    TransferError,
    read_snapshot,
    refuse_live,
    snapshot_from_bytes,
    snapshot_to_bytes,
    verify_copy,
    write_snapshot,
)
from ledgerstore.plugins import create_metadata_store, installed, load_driver
from ledgerstore.recovery.markers import CANDIDATES
from ledgerstore.startup import quiet_client_libraries

T = TypeVar("T")
#: keys bound to a live process's session: never copied, and none may exist while copying
LIVE = (layout.AVAILABLE, CANDIDATES)


def store_of_config(path: str, uri: str | None = None) -> tuple[str, dict[str, Any]]:
    """The metadata URI (``uri`` if given) and store options a client's or a bookie's TOML config names."""

    if is_bookie_config(path):
        bookie = load_bookie_config(path)
        return uri or bookie.metadata, dict(bookie.metadata_options)

    client = load_client_config(path, **({"metadata": uri} if uri else {}))
    return client.metadata, dict(client.metadata_options)


def _store_of(sc: Any) -> tuple[str, dict[str, Any]]:
    """The metadata URI and store options the shell's ``--metadata`` / ``--config`` name."""
    if sc.config:
        return store_of_config(sc.config, sc.metadata)
    return sc.client_kwargs()["metadata"], {}


def _open(uri: str, options: dict[str, Any]) -> MetadataStore:
    return create_metadata_store(uri, **options)  # type: ignore[no-any-return]


async def _on(uri: str, options: dict[str, Any], fn: Callable[[MetadataStore], Awaitable[T]]) -> T:
    store = _open(uri, options)
    try:
        with quiet_client_libraries():  # an unreachable store is one line, not a reconnect log
            await store.start()
        return await fn(store)
    finally:
        await store.close()


def _refuse_missing_source(uri: str) -> None:
    # a sqlite store creates its file on connect: a mistyped source path must not leave one
    refuse_missing_sqlite_file(uri)


async def _import(snap: Snapshot, uri: str, options: dict[str, Any]) -> dict[str, int]:
    async def go(store: MetadataStore) -> dict[str, int]:
        await refuse_live(store, LIVE, uri)
        await write_snapshot(store, snap, uri)
        return await verify_copy(store, snap, LIVE, uri)

    return await _on(uri, options, go)


def _report(verb: str, snap: Snapshot, counts: dict[str, int], where: str, seconds: float, as_json: bool,
            **extra: Any) -> None:
    summary = {verb: True, "instance_id": snap.instance_id, "keys": len(snap.keys), "counts": counts,
               "ledger_id_counter": snap.counters.get(layout.LEDGER_ID_COUNTER), "seconds": round(seconds, 3), **extra}
    if as_json:
        emit(summary, True)
        return
    what = ", ".join(f"{n} {kind}" for kind, n in counts.items())
    # one line, never wrapped at the terminal's width
    click.echo(f"{verb} cluster {snap.instance_id} {where}: {len(snap.keys)} keys ({what}), verified, "
               f"in {seconds:.1f}s")


def plugin_counters() -> list[str]:
    """The metadata counters the installed protocol handlers allocate from (their
    ``metadata_counters``), for a move to carry; a handler that cannot be loaded is named in a
    warning (its counters, if any, are not carried)."""
    names: list[str] = []
    for name in installed("protocol"):
        try:
            names.extend(getattr(load_driver("protocol", name), "metadata_counters", ()))
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not stop a metadata move
            click.echo(f"warning: protocol handler {name!r} cannot be loaded ({exc}); "
                       "the counters it allocates from, if any, are not carried", err=True)
    return names


@click.command("metadata-export")
@click.option("--to", "to_file", type=click.Path(dir_okay=False), required=True,
              help="the backup file to write (mode 0600: it holds what the store holds)")
@json_option
@click.pass_obj
@handle_errors
def metadata_export(sc: Any, to_file: str, as_json: bool) -> None:
    """Save the whole cluster metadata (--metadata / --config) to a file. Offline only."""
    uri, options = _store_of(sc)
    _refuse_missing_source(uri)
    t0 = time.monotonic()
    counters = plugin_counters()
    snap = asyncio.run(_on(uri, options, lambda store: read_snapshot(store, LIVE, uri, counters)))
    data = snapshot_to_bytes(snap)
    tmp = Path(f"{to_file}.tmp-{os.getpid()}")
    write_private(tmp, data)
    os.replace(tmp, to_file)  # a crash leaves the old file or the new one, never half of one
    if snapshot_from_bytes(Path(to_file).read_bytes(), to_file).keys != snap.keys:
        raise TransferError(f"verification failed: {to_file} does not read back as written")
    _report("exported", snap, snap.counts(), f"to {to_file}", time.monotonic() - t0, as_json, file=to_file,
            bytes=len(data))


@click.command("metadata-import")
@click.option("--from", "from_file", type=click.Path(dir_okay=False, exists=True), required=True,
              help="a file metadata-export wrote")
@json_option
@click.pass_obj
@handle_errors
def metadata_import(sc: Any, from_file: str, as_json: bool) -> None:
    """Write a metadata-export file into an empty metadata store (--metadata / --config), then
    read it back and compare. Refused if the store holds any key or a process is registered."""
    uri, options = _store_of(sc)
    snap = snapshot_from_bytes(Path(from_file).read_bytes(), from_file)
    t0 = time.monotonic()
    counts = asyncio.run(_import(snap, uri, options))
    _report("imported", snap, counts, f"into {uri}", time.monotonic() - t0, as_json, file=from_file)


@click.command("metadata-copy")
@click.option("--from", "from_uri", help="the source metadata URI (an offline cluster)")
@click.option("--to", "to_uri", help="the target metadata URI (an empty store)")
@click.option("--from-config", type=click.Path(dir_okay=False, exists=True),
              help="a client's or bookie's TOML config naming the source and its store options (TLS, auth)")
@click.option("--to-config", type=click.Path(dir_okay=False, exists=True),
              help="a client's or bookie's TOML config naming the target and its store options")
@json_option
@handle_errors
def metadata_copy(from_uri: str | None, to_uri: str | None, from_config: str | None, to_config: str | None,
                  as_json: bool) -> None:
    """Copy the whole cluster metadata from one store to another (any backends), then read the
    target back and compare. Offline only; the target must be empty."""

    def side(uri: str | None, config: str | None, name: str) -> tuple[str, dict[str, Any]]:
        if config:
            return store_of_config(config, uri)
        if not uri:
            raise click.UsageError(f"give --{name} URI or --{name}-config FILE")
        return uri, {}

    from_uri, from_options = side(from_uri, from_config, "from")
    to_uri, to_options = side(to_uri, to_config, "to")
    if from_uri == to_uri:
        raise ConfigError(f"--from and --to are the same store: {from_uri}")
    _refuse_missing_source(from_uri)
    t0 = time.monotonic()
    source = from_uri
    counters = plugin_counters()
    snap = asyncio.run(_on(source, from_options, lambda store: read_snapshot(store, LIVE, source, counters)))
    counts = asyncio.run(_import(snap, to_uri, to_options))
    _report("copied", snap, counts, f"from {from_uri} to {to_uri}", time.monotonic() - t0, as_json,
            source=from_uri, target=to_uri)

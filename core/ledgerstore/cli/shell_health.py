"""``shell healthcheck``: the cluster-wide switch of the periodic bookie health check, kept in the
metadata store where BookKeeper keeps it (a ``disableHealthCheck`` node: present = disabled)."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.cli.shell_local import json_option
from ledgerstore.errors import NoSuchKeyError

#: BookKeeper's node: present = the clients' periodic bookie health check is disabled cluster-wide
HEALTH_CHECK_DISABLED = "/disableHealthCheck"


async def health_check_enabled(store: Any) -> bool:
    """True unless the health check was disabled cluster-wide (``shell healthcheck -enable false``)."""
    return await store.get(HEALTH_CHECK_DISABLED) is None


async def set_health_check(store: Any, enabled: bool) -> None:
    """Enable (delete the node) or disable (create it) the periodic health check cluster-wide."""
    if enabled:
        try:
            await store.delete(HEALTH_CHECK_DISABLED)
        except NoSuchKeyError:
            pass  # already enabled
    else:
        await store.put(HEALTH_CHECK_DISABLED, json.dumps({"disabled_at": time.time()}).encode())


@click.command("healthcheck")
@click.option("-e", "--enable", type=bool, default=None, help="true or false: switch the health check on or off")
@click.option("-d", "--disable", is_flag=True, help="the same as -enable false")
@click.option("-s", "--status", is_flag=True, help="print whether it is enabled (the default action)")
@json_option
@click.pass_obj
@handle_errors
def healthcheck(sc: Any, enable: bool | None, disable: bool, status: bool, as_json: bool) -> None:
    """Enable, disable or show the periodic bookie health check kept in the cluster metadata
    (BookKeeper's ``healthcheck -enable true|false -status``)."""
    if disable:
        if enable:
            raise click.UsageError("-enable true and -disable contradict each other")
        enable = False

    async def go(client: Any) -> bool:
        if enable is not None:
            await set_health_check(client.store, enable)
        return await health_check_enabled(client.store)

    enabled = sc.with_client(go)
    if as_json:
        emit({"enabled": enabled}, True)
    else:
        click.echo(f"health check is {'enabled' if enabled else 'disabled'}")

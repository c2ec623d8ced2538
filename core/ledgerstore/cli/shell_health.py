"""``shell healthcheck``: the cluster-wide switch of the periodic bookie health check, kept in the
metadata store where BookKeeper keeps it (a ``disableHealthCheck`` node: present = disabled). The
clients' health checks (:mod:`ledgerstore.client.health`) read it at every interval."""

from __future__ import annotations

from typing import Any

import click

from ledgerstore.cli.common import emit, handle_errors
from ledgerstore.cli.shell_local import json_option
from ledgerstore.client.health import HEALTH_CHECK_DISABLED, health_check_enabled, set_health_check

__all__ = ["HEALTH_CHECK_DISABLED", "health_check_enabled", "healthcheck", "set_health_check"]


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

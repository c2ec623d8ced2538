"""``shell`` commands on the cluster's instance: ``whatisinstanceid``, ``initnewcluster``,
``metaformat`` and ``nukeexistingcluster``."""

from __future__ import annotations

from typing import Any, TypeVar

import click

from ledgerstore.cli.common import console, emit, handle_errors
from ledgerstore.cli.shell_context import ShellContext, pass_ctx
from ledgerstore.cli.shell_health import HEALTH_CHECK_DISABLED
from ledgerstore.cli.shell_local import (
    json_option,
)
from ledgerstore.errors import LedgerStoreError
from ledgerstore.meta import layout
from ledgerstore.meta.bookies import ClusterManager

T = TypeVar("T")


@click.command()
@json_option
@pass_ctx
@handle_errors
def whatisinstanceid(sc: ShellContext, as_json: bool) -> None:
    """Print the cluster's instance id."""
    iid = sc.with_client(lambda c: c.instance_id(), need_cluster=False)  # "none" is an answer here
    if as_json:
        emit({"instance_id": iid}, True)
    else:
        console.print(iid or "(no cluster initialised)")


@click.command()
@json_option
@pass_ctx
@handle_errors
def initnewcluster(sc: ShellContext, as_json: bool) -> None:
    """Create a new cluster (instance id and layout) in an empty metadata store."""

    async def go(client: Any) -> str:
        cm = ClusterManager(client.store)
        existing = await cm.instance_id()
        if existing is not None:
            raise LedgerStoreError(f"the metadata store already holds cluster {existing}; "
                                   "use nukeexistingcluster first to start over")
        return await cm.init()

    iid = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"instance_id": iid}, True)
    else:
        console.print(f"new cluster initialised: instance id {iid}")


async def _erase_cluster_metadata(store: Any) -> None:
    for path in (layout.LEDGERS, layout.LOGS, layout.UNDERREPLICATION, layout.AVAILABLE, layout.COOKIES,
                 layout.LAYOUT, layout.INSTANCE_ID, "/auditor", HEALTH_CHECK_DISABLED):
        await store.delete_recursive(path)


@click.command()
@click.option("-n", "--nonInteractive", "non_interactive", is_flag=True,
              help="never ask: refuse if the store already holds a cluster (unless -f)")
@click.option("-f", "--force", is_flag=True, help="erase an existing cluster's metadata without asking")
@json_option
@pass_ctx
@handle_errors
def metaformat(sc: ShellContext, non_interactive: bool, force: bool, as_json: bool) -> None:
    """Format the cluster metadata: erase whatever cluster it holds (asking first) and initialise a
    new one. Bookies' data on disk is not touched: format them before they join (bookieformat)."""

    async def existing_cluster(client: Any) -> tuple[str | None, bool]:
        # As BookKeeper does, any ledgers, cookies or registered bookies count as existing data,
        # with or without an instance id.
        iid = await ClusterManager(client.store).instance_id()
        data = [await client.store.children(p) for p in (layout.LEDGERS, layout.COOKIES, layout.AVAILABLE)]
        return iid, iid is not None or any(data)

    existing, has_data = sc.with_client(existing_cluster, need_cluster=False)
    if has_data and not force:
        what = f"cluster {existing}" if existing else "cluster metadata (ledgers, cookies or bookies)"
        if non_interactive:
            raise LedgerStoreError(f"the metadata store holds {what}; pass -f to erase it")
        if not click.confirm(f"erase the {what}?", default=False):
            raise click.Abort()

    async def go(client: Any) -> str:
        await _erase_cluster_metadata(client.store)
        return await ClusterManager(client.store).init()

    iid = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"instance_id": iid, "erased_instance_id": existing}, True)
    else:
        console.print(f"metadata formatted: instance id {iid}" + (f" (cluster {existing} erased)" if existing else ""))


@click.command()
@click.option("-i", "--instanceid", "instance_id", help="the instance id to nuke (a safety check)")
@click.option("-f", "--force", is_flag=True, help="nuke without checking the instance id")
@json_option
@pass_ctx
@handle_errors
def nukeexistingcluster(sc: ShellContext, instance_id: str | None, force: bool, as_json: bool) -> None:
    """Delete every piece of cluster metadata (ledgers, logs, cookies, registrations, instance id).
    Bookies' data on disk is not touched: format them before they join a new cluster."""

    if not force and not instance_id:
        raise click.UsageError("give --instanceid ID (see whatisinstanceid) or --force")

    async def go(client: Any) -> str | None:
        existing = await ClusterManager(client.store).instance_id()
        if not force and existing != instance_id:
            raise LedgerStoreError(f"instance id mismatch: the cluster is {existing!r}, you named {instance_id!r}")
        await _erase_cluster_metadata(client.store)
        return existing

    nuked = sc.with_client(go, need_cluster=False)
    if as_json:
        emit({"nuked_instance_id": nuked}, True)
    else:
        console.print(f"cluster {nuked} nuked")

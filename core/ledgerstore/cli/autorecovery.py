"""``ledgerstore autorecovery``: run an auditor candidate and a replication worker on their own,
outside any bookie, until SIGTERM/Ctrl-C."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

from ledgerstore.cli.common import cluster_client, handle_errors, run_async, setup_logging


@click.command()
@click.option("--metadata", envvar="LEDGERSTORE_METADATA", help="metadata store URI (or $LEDGERSTORE_METADATA)")
@click.option("--config", "config_path", type=click.Path(dir_okay=False),
              help="a bookie TOML file: its metadata settings and [bookie.autorecovery] table are used")
@click.option("--id", "process_id", default=None, help="auditor candidate / worker id (default autorecovery-HOST-PID)")
@click.option("--lost-bookie-recovery-delay", "delay", type=float, default=None, help="seconds")
@click.option("--audit-interval", type=float, default=None, help="seconds between full checks")
@click.option("--entries-per-second", "rate", type=float, default=None, help="copy throttle per worker (omit for none)")
@click.option("--open-ledger-grace", "grace", type=float, default=None, help="seconds")
@click.option("--lease", type=float, default=None, help="seconds a worker's claim lasts without renewal")
@click.option("--log-level", default="INFO", show_default=True)
@handle_errors
def autorecovery(metadata: str | None, config_path: str | None, process_id: str | None, delay: float | None,
                 audit_interval: float | None, rate: float | None, grace: float | None, lease: float | None,
                 log_level: str) -> None:
    """Run auto-recovery (auditor candidate + replication worker) until SIGTERM/Ctrl-C."""
    from ledgerstore.config import AutoRecoveryConfig, ClientConfig, load_bookie_config
    from ledgerstore.errors import ConfigError
    from ledgerstore.recovery.service import run_standalone
    from ledgerstore.runtime import install_fast_loop

    setup_logging(log_level)
    if config_path:
        bcfg = load_bookie_config(config_path, **({"metadata": metadata} if metadata else {}))
        settings = bcfg.autorecovery
        client_config = ClientConfig(metadata=bcfg.metadata, metadata_options=dict(bcfg.metadata_options),
                                     transport=dict(settings.client_transport), max_frame_size=bcfg.max_frame_size,
                                     placement=settings.placement, placement_options=dict(settings.placement_options))
    else:
        if not metadata:
            raise ConfigError("no metadata store: pass --metadata URI, --config bookie.toml or set LEDGERSTORE_METADATA")
        settings = AutoRecoveryConfig()
        client_config = ClientConfig(metadata=metadata)
    overrides: dict[str, Any] = {"lost_bookie_recovery_delay_s": delay, "audit_interval_s": audit_interval,
                 "rereplication_entries_per_s": rate, "open_ledger_rereplication_grace_s": grace, "lease_s": lease}
    settings = dataclasses.replace(settings, **{k: v for k, v in overrides.items() if v is not None})
    problems = settings.validate() + client_config.validate()
    if problems:
        raise ConfigError("invalid auto-recovery settings:\n  - " + "\n  - ".join(problems))
    install_fast_loop()

    async def run() -> None:
        # A URI holding no cluster is refused in one line before anything registers there.
        async with cluster_client(config=client_config):
            pass
        await run_standalone(client_config, settings, process_id,
                             ready=lambda s: click.echo(f"autorecovery {s.process_id} ready", err=False))

    run_async(run())

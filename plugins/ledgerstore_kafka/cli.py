"""``ledgerstore kafka --config kafka.toml``: one Kafka broker process for a ledgerstore cluster.

Contributed to the command line through the ``ledgerstore_cli_commands`` hook. The file names the
cluster's metadata URI and the handler's options (:class:`KafkaHandler.Options`)::

    metadata = "sqlite+tcp://127.0.0.1:4181"   # as ``ledgerstore standalone`` prints it

    [kafka]
    host = "127.0.0.1"
    port = 9092
    num_partitions = 3

Every problem in the file is one line naming the key, and exit code 2.
"""

from __future__ import annotations

import asyncio
import signal
import tomllib
from pathlib import Path
from typing import Any

import click

import ledgerstore
from ledgerstore.api.protocol import ProtocolHandler
from ledgerstore.cli.common import handle_errors, setup_logging
from ledgerstore.cli.protocol_handlers import check_handler_options, serve
from ledgerstore.errors import ConfigError

__all__ = ["kafka", "load_kafka_config"]

_KEYS = {"metadata", "kafka"}


def load_kafka_config(path: str) -> tuple[str, dict[str, Any]]:
    """``(metadata URI, [kafka] option table)`` of a ``kafka.toml``, both checked."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown key {unknown[0]!r}; a kafka.toml holds 'metadata' and a [kafka] table")
    metadata = raw.get("metadata")
    if not isinstance(metadata, str) or "://" not in metadata:
        raise ConfigError(f"{path}: 'metadata' must be the cluster's metadata URI, e.g. \"sqlite+tcp://127.0.0.1:4181\"")
    options = raw.get("kafka", {})
    if not isinstance(options, dict):
        raise ConfigError(f"{path}: 'kafka' must be a table ([kafka])")
    try:
        check_handler_options("kafka", options)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return metadata, options


@click.command()
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="kafka.toml: the cluster's metadata URI and a [kafka] table")
@click.option("--log-level", default="INFO", show_default=True)
@handle_errors
def kafka(config_path: str, log_level: str) -> None:
    """Serve the Kafka protocol on a ledgerstore cluster until SIGTERM/Ctrl-C."""
    metadata, options = load_kafka_config(config_path)
    setup_logging(log_level)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)

        def ready(handlers: list[ProtocolHandler]) -> None:
            for h in handlers:
                host, port = h.address
                click.echo(f"kafka ready on {host}:{port}", err=False)

        await serve(metadata, [("kafka", options)], stop, ready)

    asyncio.run(main())


@ledgerstore.hookimpl
def ledgerstore_cli_commands() -> list[Any]:
    return [kafka]

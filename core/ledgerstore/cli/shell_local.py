"""Helpers of the shell's bookie-local tools: the directory lock, the bookie's id and metadata store."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ledgerstore.api.transport import split_address
from ledgerstore.bookie.dirlock import DirectoryLockedError, DirLock
from ledgerstore.cli.common import run_async
from ledgerstore.plugins import create_metadata_store

T = TypeVar("T")


def lock_bookie_dirs(cfg: Any, tool: str) -> Any:
    """The taken lock on the bookie's journal and ledger directories (release it when done)."""

    lock = DirLock([Path(cfg.journal_dir), *(Path(d) for d in cfg.ledger_dirs)])
    try:
        lock.acquire()
    except DirectoryLockedError as exc:
        raise DirectoryLockedError(f"{tool} refused: {exc}") from None
    return lock


def bookie_id_of(cfg: Any) -> str:
    """The id (host:port) the bookie the config describes registers under."""

    _, host, port = split_address(cfg.advertised_address or cfg.listen)
    return f"{host}:{port}"


def with_bookie_store(cfg: Any, fn: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``fn`` against the metadata store the bookie's config names."""

    async def go() -> T:
        store = create_metadata_store(cfg.metadata, **cfg.metadata_options)
        await store.start()
        try:
            return await fn(store)
        finally:
            await store.close()

    return run_async(go())


config_option = click.option("--config", "bookie_config", type=click.Path(dir_okay=False, exists=True), required=True,
                             help="the bookie's TOML config")
json_option = click.option("--json", "as_json", is_flag=True, help="machine-readable output")

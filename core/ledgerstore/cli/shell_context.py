"""What every ``shell`` command that talks to a cluster is handed: the metadata URI or config it
was given (``ShellContext``), and ``pass_ctx``, the decorator that passes it."""

from __future__ import annotations

import tomllib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click

from ledgerstore.aio import Client
from ledgerstore.cli.common import cluster_client, run_async
from ledgerstore.config import load_bookie_config, load_client_config
from ledgerstore.errors import ConfigError

T = TypeVar("T")


def is_bookie_config(path: str) -> bool:
    """True for a TOML file with a ``[bookie]`` table and no ``[client]`` one."""

    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError):
        return False  # the client config loader reports the problem with its own message
    return "bookie" in doc and "client" not in doc


class ShellContext:
    """The metadata URI and config file given to ``shell``; opens a client on them for a command."""

    def __init__(self, metadata: str | None, config: str | None) -> None:
        self.metadata = metadata
        self.config = config

    def client_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of ``Client`` that reach the cluster this shell was pointed at."""
        if self.config and is_bookie_config(self.config):
            # As BookKeeper's shell does with bk_server.conf: a bookie's config names the metadata store.
            return {"metadata": self.metadata or load_bookie_config(self.config).metadata}
        if self.config:
            return {"config": load_client_config(self.config, **({"metadata": self.metadata} if self.metadata else {}))}
        if not self.metadata:
            raise ConfigError("no metadata store: pass --metadata URI, --config client.toml or set LEDGERSTORE_METADATA")
        return {"metadata": self.metadata}

    def with_client(self, fn: Callable[[Any], Awaitable[T]], *, need_cluster: bool = True) -> T:
        """Run ``fn(client)``. Unless ``need_cluster`` is false (the commands that create or erase
        a cluster), a metadata URI holding no cluster fails in one line and nothing is created."""

        async def go() -> T:
            if need_cluster:
                async with cluster_client(**self.client_kwargs()) as client:
                    return await fn(client)
            async with Client(**self.client_kwargs(), need_cluster=False) as client:
                return await fn(client)

        return run_async(go())


pass_ctx = click.make_pass_decorator(ShellContext)

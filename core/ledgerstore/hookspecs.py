"""Every pluggy hook ledgerstore calls, declared once.

Plugins implement hooks with ``@ledgerstore.hookimpl`` and register the module or object under the
entry-point group ``ledgerstore.hooks``. Hooks are called on lifecycle and ledger events, never on
the per-entry path.

Implementations are isolated from each other: one that raises is logged with its plugin's name,
counts as having returned nothing, and the other implementations still run
(:class:`ledgerstore.plugins.IsolatingPluginManager`). A faulty plugin cannot break the data path,
a start-up, or another plugin.

The arguments are typed; ``bookie`` and ``client`` are described by the narrow protocols below
(what a hook may rely on), not by the classes that implement them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Literal, Protocol

import click
import pluggy

from ledgerstore.api.http import Request, Response
from ledgerstore.config_schema import BookieConfig, ClientConfig
from ledgerstore.meta.ledgers import LedgerMetadata

hookspec = pluggy.HookspecMarker("ledgerstore")
hookimpl = pluggy.HookimplMarker("ledgerstore")


class BookieView(Protocol):
    """What a hook may use of a bookie (a :class:`ledgerstore.bookie.server.Bookie`)."""

    #: ``host:port``, the bookie's id in the cluster
    bookie_id: str
    #: the bookie's validated configuration
    config: BookieConfig


class ClientView(Protocol):
    """What a hook may use of a client (an :class:`ledgerstore.aio.Client`)."""

    #: the client's validated configuration
    config: ClientConfig


#: what an admin HTTP handler answers: a Response or ``(status, content_type, body)``
HttpAnswer = Response | tuple[int, str, bytes]
#: ``(method, path, handler)`` of an admin HTTP route; the handler may be a coroutine function
HttpRoute = tuple[str, str, Callable[[Request], Awaitable[HttpAnswer] | HttpAnswer]]


# --- configuration -----------------------------------------------------------------------------


@hookspec
def ledgerstore_config_validate(
    kind: Literal["bookie", "client"], config: BookieConfig | ClientConfig
) -> list[str] | None:
    """Called once after a ``bookie`` or ``client`` configuration (``kind``) is loaded.

    Return a list of problems (each a sentence naming the key) to refuse the configuration, or
    ``None``/``[]`` to accept it.
    """


# --- lifecycle ---------------------------------------------------------------------------------


@hookspec
def ledgerstore_bookie_started(bookie: BookieView) -> None:
    """Called when a bookie has registered and serves requests. ``bookie`` is the
    :class:`ledgerstore.bookie.server.Bookie`."""


@hookspec
def ledgerstore_bookie_stopping(bookie: BookieView) -> None:
    """Called when a bookie begins to shut down, before it unregisters."""


@hookspec
def ledgerstore_client_started(client: ClientView) -> None:
    """Called when an :class:`ledgerstore.aio.Client` has connected to the metadata store."""


@hookspec
def ledgerstore_client_stopping(client: ClientView) -> None:
    """Called when a client begins to close."""


# --- ledger events -----------------------------------------------------------------------------


@hookspec
def ledgerstore_ledger_created(ledger_id: int, metadata: LedgerMetadata) -> None:
    """A ledger was created by this process, with this metadata."""


@hookspec
def ledgerstore_ledger_closed(ledger_id: int, last_entry_id: int, recovered: bool) -> None:
    """A ledger was closed by this process, as writer or (``recovered``) by recovery."""


@hookspec
def ledgerstore_ledger_deleted(ledger_id: int) -> None:
    """A ledger was deleted by this process."""


@hookspec
def ledgerstore_ensemble_changed(ledger_id: int, first_entry_id: int, old: list[str], new: list[str]) -> None:
    """A writer replaced bookies: a new fragment starts at ``first_entry_id``."""


# --- contributions -----------------------------------------------------------------------------


@hookspec
def ledgerstore_cli_commands() -> list[click.Command] | None:
    """Return click commands to add to the ``ledgerstore`` command line."""


@hookspec
def ledgerstore_shell_commands() -> list[click.Command] | None:
    """Return click commands to add under ``ledgerstore shell``."""


@hookspec
def ledgerstore_http_routes(bookie: BookieView) -> list[HttpRoute] | None:
    """Return ``(method, path, handler)`` routes to add to a bookie's admin HTTP server.
    ``handler(request) -> (status, content_type, body_bytes)`` (or a coroutine of it)."""

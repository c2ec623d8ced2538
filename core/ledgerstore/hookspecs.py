"""Every pluggy hook ledgerstore calls, declared once.

Plugins implement hooks with ``@ledgerstore.hookimpl`` and register the module or object under the
entry-point group ``ledgerstore.hooks``. Hooks are called on lifecycle and ledger events, never on
the per-entry path. Exceptions raised by an implementation propagate to the caller, except for the
observer hooks (``*_created``, ``*_closed``, ...), whose failures are logged and ignored so that a
faulty observer cannot break the data path.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("ledgerstore")
hookimpl = pluggy.HookimplMarker("ledgerstore")


# --- configuration -----------------------------------------------------------------------------


@hookspec
def ledgerstore_config_validate(kind: str, config: Any) -> list[str] | None:
    """Called once after a ``bookie`` or ``client`` configuration (``kind``) is loaded.

    Return a list of problems (each a sentence naming the key) to refuse the configuration, or
    ``None``/``[]`` to accept it.
    """


# --- lifecycle ---------------------------------------------------------------------------------


@hookspec
def ledgerstore_bookie_started(bookie: Any) -> None:
    """Called when a bookie has registered and serves requests. ``bookie`` is the
    :class:`ledgerstore.bookie.server.Bookie`."""


@hookspec
def ledgerstore_bookie_stopping(bookie: Any) -> None:
    """Called when a bookie begins to shut down, before it unregisters."""


@hookspec
def ledgerstore_client_started(client: Any) -> None:
    """Called when an :class:`ledgerstore.aio.Client` has connected to the metadata store."""


@hookspec
def ledgerstore_client_stopping(client: Any) -> None:
    """Called when a client begins to close."""


# --- ledger events -----------------------------------------------------------------------------


@hookspec
def ledgerstore_ledger_created(ledger_id: int, metadata: Any) -> None:
    """A ledger was created by this process (``metadata`` is a ``LedgerMetadata``)."""


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
def ledgerstore_cli_commands() -> list[Any] | None:
    """Return click commands to add to the ``ledgerstore`` command line."""


@hookspec
def ledgerstore_shell_commands() -> list[Any] | None:
    """Return click commands to add under ``ledgerstore shell``."""


@hookspec
def ledgerstore_http_routes(bookie: Any) -> list[tuple[str, str, Any]] | None:
    """Return ``(method, path, handler)`` routes to add to a bookie's admin HTTP server.
    ``handler(request) -> (status, content_type, body_bytes)``."""

"""What a log's writer, reader and admin calls share: the view of the client logs work against
(:class:`LogClient`), how a log's ledgers are created (:class:`LedgerSettings`), and the log
metadata manager over the client's store."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Protocol

from ledgerstore.api import MetadataStore
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.read import ReadHandle
from ledgerstore.meta.ledgers import LedgerMetadata
from ledgerstore.meta.logs import LogManager


class LogClient(Protocol):
    """What logs use of :class:`ledgerstore.client.client.Client`: its public ledger calls, its
    metadata store and its event loop (logs sit above ledgers and see nothing else)."""

    store: MetadataStore | None
    loop: asyncio.AbstractEventLoop

    async def create_ledger(self, ensemble: int | None = None, write_quorum: int | None = None,
                            ack_quorum: int | None = None, digest: str | None = None,
                            password: bytes = b"", custom_metadata: dict[str, str] | None = None) -> LedgerHandle:
        """Create a ledger (see ``Client.create_ledger``)."""
        ...

    async def open_ledger(self, ledger_id: int, password: bytes = b"", recovery: bool = True) -> ReadHandle:
        """Open a ledger for reading, recovering it first when ``recovery`` (see ``Client.open_ledger``)."""
        ...

    async def delete_ledger(self, ledger_id: int) -> None:
        """Delete a ledger's metadata."""
        ...

    async def ledger_metadata(self, ledger_id: int) -> LedgerMetadata:
        """A ledger's metadata as stored."""
        ...


@dataclasses.dataclass(frozen=True)
class LedgerSettings:
    """How the ledgers of a log are created."""

    ensemble: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    digest: str | None = None
    password: bytes = b""


def log_manager(client: LogClient) -> LogManager:
    """The log metadata manager over ``client``'s store (the client must be started)."""
    # writers and readers are made by a started client, and a started client has its store
    assert client.store is not None, "the client is not started"
    return LogManager(client.store)

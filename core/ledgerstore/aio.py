"""The asyncio API: ``ledgerstore.aio.Client`` and its handles (coroutines throughout)."""

from ledgerstore.client.client import Client
from ledgerstore.client.ledger import LedgerHandle, ReadHandle
from ledgerstore.client.log import LogReader, LogWriter, Position
from ledgerstore.proto.digest import Entry

__all__ = ["Client", "Entry", "LedgerHandle", "LogReader", "LogWriter", "Position", "ReadHandle"]

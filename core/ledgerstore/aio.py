"""The asyncio API: ``ledgerstore.aio.Client`` and its handles (coroutines throughout)."""

from ledgerstore.client.client import Client
from ledgerstore.client.ledger import LedgerHandle
from ledgerstore.client.log import LogReader, LogRecord, LogWriter, Position
from ledgerstore.client.read import ReadHandle
from ledgerstore.proto.digest import Entry

__all__ = ["Client", "Entry", "LedgerHandle", "LogReader", "LogRecord", "LogWriter", "Position", "ReadHandle"]

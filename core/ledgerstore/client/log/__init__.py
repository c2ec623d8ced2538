"""Named logs built from ledgers (the seeds' "Ledgers to logs"): the leader's writer, readers,
and the calls that change a log as a whole.

A log is an ordered list of ledgers in the metadata store (:mod:`ledgerstore.meta.logs`). The
package is split by job: :mod:`.writer` (becoming the leader, appending, rolling),
:mod:`.reader` (reading and tailing, never fencing), :mod:`.admin` (list, delete, truncate), with
:mod:`.tail` (recovering the ledgers a new leader must close) and :mod:`.base` (what they share)
below them. Exactly-once appends add :mod:`.entry` (the entry header codec), :mod:`.producers`
(the leader's producer table) and :mod:`.rebuild` (the table from the log, and its snapshots).
The entry codec is public (``decode_entry`` and friends) for code that writes or reads a log's
ledgers directly, as the Spark connector does. The public names are re-exported here.
"""

from __future__ import annotations

from ledgerstore.client.log.admin import fence_and_delete_log, list_logs, truncate_log
from ledgerstore.client.log.base import LedgerSettings, LogClient
from ledgerstore.client.log.entry import (
    FORMAT_KEY,
    FORMAT_SEQUENCED,
    LogRecord,
    decode_entry,
    encode_entry,
    is_sequenced_format,
    producer_header,
)
from ledgerstore.client.log.reader import LogReader, StartAt, open_log_reader
from ledgerstore.client.log.writer import LogWriter, open_log_writer
from ledgerstore.meta.logs import Position

__all__ = ["FORMAT_KEY", "FORMAT_SEQUENCED", "LedgerSettings", "LogClient", "LogReader", "LogRecord",
           "decode_entry", "encode_entry", "is_sequenced_format", "producer_header", "LogWriter", "Position", "StartAt", "fence_and_delete_log",
           "list_logs", "open_log_reader", "open_log_writer", "truncate_log"]

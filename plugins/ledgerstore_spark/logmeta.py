"""Access to a log's metadata (its ordered ledger list) for the connector.

The public client API reads and writes logs entry by entry; the connector also needs the ledger
list itself (to plan partitions and offsets) and a compare-and-set that appends several closed
ledgers at once (to commit a write job atomically). Both live here, in one place, on top of the
log metadata manager.
"""

from __future__ import annotations

import ledgerstore
from ledgerstore.errors import BadVersionError, LogError
from ledgerstore.meta.logs import LogManager, LogMetadata, Position
from ledgerstore_spark.clients import run


def read_log(client: ledgerstore.Client, name: str) -> LogMetadata | None:
    """The log's metadata (with its store version), or None if there is no such log."""
    return run(client, LogManager(client.aio.store).read(name))


def get_or_create_log(client: ledgerstore.Client, name: str) -> LogMetadata:
    return run(client, LogManager(client.aio.store).get_or_create(name))


def require_log(client: ledgerstore.Client, name: str) -> LogMetadata:
    """The log's metadata; LogError naming the log (and a few that exist) if there is no such log."""
    md = read_log(client, name)
    if md is None:
        names = client.list_logs()
        known = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
        raise LogError(f"log {name!r} (option 'log') does not exist in this cluster; "
                       + (f"its logs are {known}" if names else "it has no logs yet"))
    return md


def append_ledgers(client: ledgerstore.Client, md: LogMetadata, ledger_ids: list[int]) -> LogMetadata:
    """CAS ``md`` with ``ledger_ids`` appended, in that order, against ``md.version``.

    BadVersionError if the log changed since ``md`` was read; LogError if a ledger id is not above
    the log's last one (position order would no longer be log order)."""
    new = md
    for lid in ledger_ids:
        new = new.with_ledger(lid)
    return run(client, LogManager(client.aio.store).write(new))


__all__ = ["BadVersionError", "LogMetadata", "Position", "append_ledgers", "get_or_create_log", "read_log",
           "require_log"]

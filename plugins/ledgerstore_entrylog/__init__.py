"""``entrylog`` storage engine: BookKeeper's interleaved ledger storage.

Entries of all ledgers are appended to shared entry logs; a per-ledger index file maps entry ids
to log locations through a bounded in-memory ledger cache. Selected with ``storage = "entrylog"``
(the bookie's default). The on-disk format is described in ``docs/storage-entrylog.md``.
"""

from ledgerstore_entrylog.engine import EntryLogStorage

__all__ = ["EntryLogStorage"]

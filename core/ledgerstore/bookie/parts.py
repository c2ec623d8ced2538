"""What a bookie serves requests with, built in one place (:meth:`ServingParts.build`) once its
storage engine is open and its metadata store started: the journal, the metadata look-ups and
the ledger rules over the engine. The bookie (``server.py``) builds them in ``start()``; tests of
the request processor build the same parts around it.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from pathlib import Path

from ledgerstore.api import MetadataStore, StorageEngine
from ledgerstore.bookie.completions import Completion
from ledgerstore.bookie.journal import Journal
from ledgerstore.bookie.ledgers import LedgerLookup, Ledgers
from ledgerstore.bookie.processor import RequestProcessor

#: builds the journal: called with :class:`Journal`'s arguments (the simulator's gives it simulated files, committed on the loop)
JournalFactory = Callable[..., Journal[Completion]]


@dataclasses.dataclass(frozen=True, slots=True)
class ServingParts:
    """The parts the request processor serves with."""

    engine: StorageEngine
    journal: Journal[Completion]
    #: metadata look-ups of ledgers new to this bookie
    lookup: LedgerLookup
    #: the ledger rules; the journal's replay target
    ledgers: Ledgers

    @classmethod
    def build(cls, processor: RequestProcessor, engine: StorageEngine, store: MetadataStore, journal_dir: Path,
              loop: asyncio.AbstractEventLoop, *, disk_usage: Callable[[], tuple[int, int, int]],
              on_disk_full: Callable[[], None], journal_factory: JournalFactory = Journal) -> ServingParts:
        """The journal (configured by ``processor.config.journal``, answering through
        ``processor``), the look-ups and the ledger rules over ``engine`` (open) and ``store``
        (started). ``disk_usage`` gives (total, used, free) bytes of the ledger disks;
        ``on_disk_full`` is called when storage found a disk full."""
        cfg = processor.config
        jc = cfg.journal
        journal = journal_factory(
            journal_dir,
            processor.on_durable,
            on_failed=processor.on_journal_failed,
            max_group_wait_ms=jc.max_group_wait_ms,
            max_group_bytes=jc.max_group_bytes,
            flush_when_queue_empty=jc.flush_when_queue_empty,
            max_file_size=jc.max_file_size_mb * 1024 * 1024,
            max_backups=jc.max_backups,
            sync=jc.sync,
            direct_io=jc.direct_io,
        )
        lookup = LedgerLookup(store, processor.counters, cfg.max_requests_awaiting_metadata, loop, processor.resume,
                              processor.refuse)
        ledgers = Ledgers(processor.state, processor.descriptors, engine, journal, lookup, disk_usage, on_disk_full)
        return cls(engine, journal, lookup, ledgers)

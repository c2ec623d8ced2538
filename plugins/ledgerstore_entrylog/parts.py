"""The parts an entrylog engine is composed of, and the one place that builds them, each given what
it needs (:mod:`~ledgerstore_entrylog.state` maps them and holds the locking argument)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from ledgerstore_entrylog.compactor import Compactor
from ledgerstore_entrylog.ledger_cache import LedgerCache
from ledgerstore_entrylog.logs import EntryLogs
from ledgerstore_entrylog.reads import Reader
from ledgerstore_entrylog.state import EngineState
from ledgerstore_entrylog.writeback import Checkpointer
from ledgerstore_entrylog.writer import Writer

__all__ = ["EngineParts"]


@dataclasses.dataclass(frozen=True)
class EngineParts:
    """The objects an :class:`EntryLogStorage` is composed of, public so that tests and tools can
    observe or instrument them (for example count the work done per hold of ``state.lock``)."""

    state: EngineState
    logs: EntryLogs
    cache: LedgerCache
    writer: Writer
    reader: Reader
    checkpointer: Checkpointer
    compactor: Compactor

    @classmethod
    def build(cls, ledger_dirs: list[Path], *, page_size: int, write_buffer_size: int, log_size_limit: int,
              sync_bytes: int, max_pages: int, flush_interval: float) -> EngineParts:
        """Compose the parts over one new state, each given what it needs."""
        state = EngineState(ledger_dirs, page_size=page_size, write_buffer_size=write_buffer_size,
                            log_size_limit=log_size_limit, sync_bytes=sync_bytes)
        logs = EntryLogs(state)
        cache = LedgerCache(state, logs, max_pages)
        checkpointer = Checkpointer(state, logs, cache, flush_interval)
        return cls(state, logs, cache, Writer(state, logs, cache), Reader(state, cache), checkpointer,
                   Compactor(state, logs, cache, checkpointer))

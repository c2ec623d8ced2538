"""Streaming reads of a log: offsets are log positions.

An offset ``{"ledger": L, "entry": E}`` means "every entry at a position before (L, E) has been
read". A micro-batch reads the entries with ``start <= position < end``. ``latestOffset`` walks the
log's ledger list from ``start``: closed ledgers count whole, the first open ledger counts up to its
last-add-confirmed, and the walk stops there (a ledger after an open one is only read once that
one is closed). Closed ledgers never change and entries up to a LAC never change, so the same
(start, end) always plans the same entries: a query restarted from its checkpoint re-reads exactly
the batch it had not committed, and nothing twice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pyarrow as pa
from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from ledgerstore.errors import ConfigError, InvalidArgumentError, LogError
from ledgerstore_spark.clients import client_for
from ledgerstore_spark.failures import planning
from ledgerstore_spark.logmeta import LogMetadata, Position, require_log
from ledgerstore_spark.options import ConnectorOptions
from ledgerstore_spark.reading import LedgerRange, check_schema, read_range, readable_end, split


def to_offset(pos: Position) -> dict[str, int]:
    return {"ledger": pos.ledger_id, "entry": pos.entry_id}


def from_offset(offset: dict[str, int]) -> Position:
    try:
        return Position(int(offset["ledger"]), int(offset["entry"]))
    except (KeyError, TypeError, ValueError):
        raise InvalidArgumentError(f"not a ledgerstore log offset: {offset!r} (expected ledger and entry)") from None


class LedgerStoreStreamReader(DataSourceStreamReader):
    """Micro-batch reader of a log (``spark.readStream.format("ledgerstore").option("log", ...)``)."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.name = opts.require_log("a streaming read")
        self.schema = schema
        # closed ledgers never change: remember their last entry instead of asking again each batch
        self._closed_end: dict[int, int] = {}

    # --- offsets -------------------------------------------------------------------------------

    @planning
    def initialOffset(self) -> dict[str, int]:
        client = client_for(self.opts.metadata)
        md = require_log(client, self.name)
        start = self.opts.starting_position
        if start == "earliest":
            return to_offset(md.truncated_before or Position(md.ledger_ids[0] if md.ledger_ids else 0, 0))
        if start == "latest":
            return to_offset(self._walk(md, Position(0, 0), None))
        try:
            return to_offset(Position.parse(start))
        except InvalidArgumentError as exc:
            raise ConfigError(f"option 'startingPosition' must be earliest, latest or 'ledger:entry': {exc}") from None

    def getDefaultReadLimit(self) -> ReadLimit:
        n = self.opts.max_entries_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    @planning
    def latestOffset(self, start: dict[str, int], limit: ReadLimit) -> dict[str, int]:
        client = client_for(self.opts.metadata)
        md = require_log(client, self.name)
        pos = self._check_not_truncated(md, from_offset(start))
        budget = limit.max_rows if isinstance(limit, ReadMaxRows) else None
        return to_offset(self._walk(md, pos, budget))

    def _check_not_truncated(self, md: LogMetadata, pos: Position) -> Position:
        tb = md.truncated_before
        if tb is None or pos >= tb:
            return pos
        if self.opts.fail_on_data_loss:
            raise LogError(
                f"log {self.name!r} was truncated before {tb} while this query was at {pos}: entries between "
                "them are gone. Restart from a new checkpoint, or set failOnDataLoss=false to skip them")
        return tb

    def _end_of(self, ledger_id: int) -> tuple[int, bool]:
        if ledger_id in self._closed_end:
            return self._closed_end[ledger_id], True
        last, closed = readable_end(client_for(self.opts.metadata), ledger_id, self.opts.password)
        if closed:
            self._closed_end[ledger_id] = last
        return last, closed

    def _walk(self, md: LogMetadata, start: Position, budget: int | None) -> Position:
        """The end offset of a batch starting at ``start`` holding at most ``budget`` entries."""
        end = start
        for lid in md.ledger_ids:
            if lid < start.ledger_id:
                continue
            first = start.entry_id if lid == start.ledger_id else 0
            last, closed = self._end_of(lid)
            n = last - first + 1
            if n > 0:
                take = n if budget is None else min(n, budget)
                end = Position(lid, first + take)
                if budget is not None:
                    budget -= take
                    if budget == 0:
                        break
            elif Position(lid, first) > end:
                end = Position(lid, first)
            if not closed:
                break  # entries of later ledgers come after this one's future entries
        return end

    # --- planning and reading ------------------------------------------------------------------

    @planning
    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        a, b = from_offset(start), from_offset(end)
        if b <= a:
            return []
        md = require_log(client_for(self.opts.metadata), self.name)
        a = self._check_not_truncated(md, a)
        parts: list[LedgerRange] = []
        for lid in md.ledger_ids:
            if lid < a.ledger_id or lid > b.ledger_id:
                continue
            first = a.entry_id if lid == a.ledger_id else 0
            if lid == b.ledger_id:
                last = b.entry_id - 1
            else:
                last, closed = self._end_of(lid)
                if not closed:
                    raise LogError(f"log {self.name!r}: ledger {lid} before the batch end {b} is still open")
            parts.extend(split(lid, first, last, self.opts.partition_size))
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LedgerRange)
        return read_range(self.opts, self.schema, partition)

    def commit(self, end: dict[str, int]) -> None:
        """Nothing to release: a log reader holds nothing on the bookies."""

    def stop(self) -> None:
        """Nothing to stop (clients are per process and closed at exit)."""


__all__ = ["LedgerStoreStreamReader", "from_offset", "to_offset"]

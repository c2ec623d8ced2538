"""Batch reads: plan input partitions (ledger entry ranges) and read them on the executors.

Each input partition is a range of entries of one ledger; an executor reads it straight from the
bookies and yields Arrow record batches. Closed ledgers are read whole, an open ledger up to its
last-add-confirmed (nothing is fenced: a live writer keeps writing).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, InputPartition
from pyspark.sql.types import BinaryType, LongType, StringType, StructField, StructType

import ledgerstore
from ledgerstore.client.log import decode_entry, is_sequenced_format
from ledgerstore.errors import ConfigError, LogError
from ledgerstore_spark.clients import client_for
from ledgerstore_spark.failures import open_for_read, planning
from ledgerstore_spark.logmeta import Position, require_log
from ledgerstore_spark.options import ConnectorOptions

#: entries fetched from the bookies per round trip of the reader (one Arrow batch each)
READ_CHUNK = 4096

BASE_SCHEMA = StructType([
    StructField("ledger_id", LongType(), False),
    StructField("entry_id", LongType(), False),
    StructField("position", StringType(), False),
    StructField("payload", BinaryType(), False),
])
COLUMNS = ("ledger_id", "entry_id", "position", "payload", "value")


def default_schema(opts: ConnectorOptions) -> StructType:
    """``ledger_id, entry_id, position, payload`` plus ``value string`` when decoding."""
    if opts.decode == "none":
        return BASE_SCHEMA
    return StructType([*BASE_SCHEMA.fields, StructField("value", StringType(), True)])


def check_schema(schema: StructType, opts: ConnectorOptions) -> None:
    """A user-given schema may reorder or omit columns, and give ``value`` any type for JSON."""
    unknown = [f.name for f in schema.fields if f.name not in COLUMNS]
    if unknown:
        raise ConfigError(f"the ledgerstore source has no column(s) {unknown}; its columns are {', '.join(COLUMNS)}")
    value = next((f for f in schema.fields if f.name == "value"), None)
    if value is not None:
        if opts.decode == "none":
            raise ConfigError("column 'value' needs option decode=utf8 or decode=json")
        if opts.decode == "utf8" and not isinstance(value.dataType, StringType):
            raise ConfigError("with decode=utf8 the 'value' column is a string; use decode=json for other types")


@dataclasses.dataclass(frozen=True)
class LedgerRange(InputPartition):
    """Entries ``first..last`` (inclusive) of one ledger: one Spark task's share of a read."""

    ledger_id: int
    first: int
    last: int

    def __post_init__(self) -> None:
        # InputPartition keeps a ``value``; keep it meaningful for Spark's plan output
        object.__setattr__(self, "value", (self.ledger_id, self.first, self.last))


def split(ledger_id: int, first: int, last: int, size: int) -> list[LedgerRange]:
    """``first..last`` of a ledger cut into ranges of at most ``size`` entries, in order."""
    return [LedgerRange(ledger_id, a, min(last, a + size - 1)) for a in range(first, last + 1, size)]


def readable_end(client: ledgerstore.Client, ledger_id: int, password: bytes) -> tuple[int, bool]:
    """(last readable entry id, closed?): a closed ledger's last entry, an open ledger's LAC.

    Opening checks the password here, on the driver, so a wrong one fails the plan with one
    message instead of failing every task."""
    rh = open_for_read(client, ledger_id, password)
    if rh.is_closed:
        return rh.metadata.last_entry_id, True
    return rh.last_add_confirmed, False


def plan_batch(opts: ConnectorOptions) -> list[LedgerRange]:
    """Input partitions for a batch read of ``opts.log`` or ``opts.ledgers``, in position order."""
    client = client_for(opts.metadata)
    if opts.ledgers:
        targets = [(lid, 0) for lid in opts.ledgers]
    elif opts.log:
        md = require_log(client, opts.log)
        tb = md.truncated_before
        targets = [(lid, tb.entry_id if tb is not None and lid == tb.ledger_id else 0) for lid in md.ledger_ids]
    else:
        raise ConfigError("a ledgerstore read needs option 'log' (a log name) or 'ledgers' (ledger ids, comma-separated)")
    parts: list[LedgerRange] = []
    for lid, first in targets:
        last, _closed = readable_end(client, lid, opts.password)
        parts.extend(split(lid, first, last, opts.partition_size))
    return parts


class _Decoder:
    """Turns payloads into the ``value`` column (UTF-8 text, or JSON into the column's type)."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        self.decode = opts.decode
        field = next((f for f in schema.fields if f.name == "value"), None)
        self.arrow_type: pa.DataType | None = None
        self.parse_into_type = False
        if field is not None:
            from pyspark.sql.pandas.types import to_arrow_type

            self.arrow_type = to_arrow_type(field.dataType)
            self.parse_into_type = self.decode == "json" and not isinstance(field.dataType, StringType)

    def column(self, payloads: list[bytes]) -> pa.Array:
        if self.decode == "utf8":
            return pa.array([p.decode("utf-8", errors="replace") for p in payloads], type=pa.string())
        # json: rows that are not JSON (or not of the column's type) get a null value, as Spark's
        # from_json does in its default PERMISSIVE mode
        docs = []
        for p in payloads:
            try:
                docs.append(json.loads(p))
            except ValueError:
                docs.append(None)
        if not self.parse_into_type:
            return pa.array([None if d is None else json.dumps(d, separators=(",", ":")) for d in docs],
                            type=pa.string())
        try:
            return pa.array(docs, type=self.arrow_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            return pa.array([self._one(d) for d in docs], type=self.arrow_type)

    def _one(self, doc: Any) -> Any:
        try:
            pa.array([doc], type=self.arrow_type)
            return doc
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
            return None


def read_range(opts: ConnectorOptions, schema: StructType, part: LedgerRange) -> Iterator[pa.RecordBatch]:
    """Read one input partition from the bookies as Arrow record batches, in entry order."""
    from pyspark.sql.pandas.types import to_arrow_schema

    client = client_for(opts.metadata)
    rh = open_for_read(client, part.ledger_id, opts.password)
    if part.last > rh.last_add_confirmed and not rh.is_closed:
        rh.read_last_add_confirmed()
    arrow_schema = to_arrow_schema(schema)
    names = [f.name for f in schema.fields]
    decoder = _Decoder(opts, schema) if "value" in names else None
    lid = part.ledger_id
    eid = part.first
    sequenced = is_sequenced_format(rh.metadata.custom)  # a log writer's ledger: entries carry a header
    while eid <= part.last:
        hi = min(part.last, eid + READ_CHUNK - 1)
        entries = rh.read(eid, hi)
        if len(entries) != hi - eid + 1:
            raise LogError(f"ledger {lid}: asked for entries {eid}..{hi}, got {len(entries)}")
        payloads = [decode_entry(e.payload)[0] for e in entries] if sequenced else [e.payload for e in entries]
        cols: dict[str, pa.Array] = {}
        for name in names:
            if name == "ledger_id":
                cols[name] = pa.array([lid] * len(payloads), type=pa.int64())
            elif name == "entry_id":
                cols[name] = pa.array(range(eid, hi + 1), type=pa.int64())
            elif name == "position":
                cols[name] = pa.array([f"{lid}:{e}" for e in range(eid, hi + 1)], type=pa.string())
            elif name == "payload":
                cols[name] = pa.array(payloads, type=pa.binary())
            else:
                assert decoder is not None
                cols[name] = decoder.column(payloads)
        yield pa.RecordBatch.from_arrays([cols[n] for n in names], schema=arrow_schema)
        eid = hi + 1


class LedgerStoreBatchReader(DataSourceReader):
    """Batch reader of a log or of raw ledgers (see :class:`ledgerstore_spark.LedgerStoreDataSource`)."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        check_schema(schema, opts)
        self.opts = opts
        self.schema = schema

    @planning
    def partitions(self) -> Sequence[InputPartition]:
        parts = plan_batch(self.opts)
        # Spark wants at least one partition; an empty range reads nothing
        return parts or [LedgerRange(-1, 0, -1)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LedgerRange)
        if partition.last < partition.first:
            return iter(())
        return read_range(self.opts, self.schema, partition)


__all__ = ["BASE_SCHEMA", "LedgerRange", "LedgerStoreBatchReader", "Position", "check_schema", "default_schema",
           "plan_batch", "read_range", "readable_end", "split"]

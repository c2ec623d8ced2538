"""Writes to a log: every task writes its own ledger; the driver makes them visible in one CAS.

A write task creates a ledger tagged with custom metadata (``spark_job``, ``partition``,
``attempt``), writes its rows to it, closes it and returns its id in its commit message. A batch
job's rows are exactly-once log entries (docs/logs.md): the ledger is marked ``log.format=2`` and
each row carries the producer ``spark:<job>:<partition>`` and its row index in the partition as
its sequence, so every attempt of a task writes the same (producer, seq) pairs and the commit keeps
one ledger per producer. Nothing is
visible yet: the ledger is not in the log. The driver's ``commit`` then acts as the log's leader
for a moment: it fences every ledger of the log that is not closed, the last two always (so a
live writer stops, as when a new leader takes over), and appends every task's ledger to the log's ledger list in one compare-and-set. Each
task's rows stay together and in order; the tasks' ledgers follow one another in the order they
were created (ledger ids must increase along a log), which is partition order unless tasks started
out of order or were retried. A job that fails before that leaves the log as it was; ``abort`` (and
``commit``, for retried tasks) delete the job's ledgers that the log does not list.

The streaming sink follows the same rule per micro-batch and makes it exactly-once: the commit of
epoch N also appends an empty, closed *marker* ledger tagged ``spark_sink``/``epoch``; the marker
joins the list in the same CAS as the data, so "epoch N is committed" and "epoch N's data is in
the log" are one fact. A commit for an epoch at or below the newest marker of its sink is skipped
(and its ledgers deleted).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.types import BinaryType, StringType, StructType

import ledgerstore
from ledgerstore.aio import LedgerHandle as AioLedgerHandle
from ledgerstore.client.log import FORMAT_KEY, FORMAT_SEQUENCED, encode_entry, producer_header
from ledgerstore.errors import (
    BadVersionError,
    ConfigError,
    InvalidArgumentError,
    LedgerStoreError,
    LogError,
    NoSuchLedgerError,
)
from ledgerstore_spark.clients import client_for, run
from ledgerstore_spark.logmeta import LogMetadata, append_ledgers, get_or_create_log, read_log
from ledgerstore_spark.options import ConnectorOptions

log = logging.getLogger(__name__)

#: how many times a commit re-reads the log after losing its compare-and-set
COMMIT_ATTEMPTS = 20
#: after aborting, how long to wait for killed task attempts before sweeping their ledgers again
ABORT_GRACE_S = 3.0
#: adds in flight per task before it waits for acknowledgements
APPEND_WINDOW = 20_000


@dataclasses.dataclass
class LedgerWritten(WriterCommitMessage):
    """What one successful write task reports to the driver."""

    partition: int
    attempt: int
    ledger_id: int | None  # None: the task had no rows and created no ledger
    entries: int
    writer: str  # the writer instance's id, also in the ledger's custom metadata
    producer: str | None = None  # the producer id its entries carry (batch writes), None: raw entries


def payload_column(schema: StructType) -> tuple[str, bool]:
    """(column name, is_string) of the column holding entry payloads: ``payload``, else ``value``."""
    for name in ("payload", "value"):
        field = next((f for f in schema.fields if f.name == name), None)
        if field is None:
            continue
        if isinstance(field.dataType, BinaryType):
            return name, False
        if isinstance(field.dataType, StringType):
            return name, True
        raise ConfigError(f"column {name!r} must be binary or string to be written to a log, "
                          f"not {field.dataType.simpleString()}; cast or serialize it (e.g. to_json) first")
    raise ConfigError(f"writing to a ledgerstore log needs a 'payload' (binary or string) or 'value' column; "
                      f"the DataFrame has {', '.join(schema.names)}")


async def _append_batch(lh: AioLedgerHandle, payloads: list[bytes],
                        pending: list[asyncio.Future[int]]) -> list[asyncio.Future[int]]:
    pending.extend(lh.append_async(p) for p in payloads)
    if len(pending) > APPEND_WINDOW:
        # acknowledgements come in entry order, so waiting on the oldest keeps the window bounded
        older, pending = pending[:-APPEND_WINDOW // 2], pending[-APPEND_WINDOW // 2:]
        await asyncio.gather(*older)
    return pending


async def _finish(lh: AioLedgerHandle, pending: list[asyncio.Future[int]]) -> None:
    await asyncio.gather(*pending)
    await lh.close()


def producer_of(job: str, partition: int) -> str:
    """The producer id of a batch job's partition: the same for every attempt of its task."""
    return f"spark:{job}:{partition}"


def write_task(opts: ConnectorOptions, schema: StructType, batches: Iterator[pa.RecordBatch],
               tags: dict[str, str], writer_id: str, sequenced: bool = False) -> LedgerWritten:
    """Write one task's rows to a new ledger and close it; delete the ledger if anything fails.
    ``sequenced``: each row is an entry of producer :func:`producer_of` with its row index as
    its sequence."""
    ctx = TaskContext.get()
    partition = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    producer = producer_of(writer_id, partition) if sequenced else None
    header = producer_header(producer) if producer is not None else b""
    column, is_string = payload_column(schema)
    client = client_for(opts.metadata)
    lh: AioLedgerHandle | None = None
    pending: list[asyncio.Future[int]] = []
    count = 0
    try:
        for batch in batches:
            values = batch.column(batch.schema.get_field_index(column))
            if values.null_count:
                raise InvalidArgumentError(f"column {column!r} has null values: a log entry needs a payload")
            payloads = [s.encode() for s in values.to_pylist()] if is_string else values.to_pylist()
            if not payloads:
                continue
            if producer is not None:
                payloads = [encode_entry(header, seq, p) for seq, p in enumerate(payloads, count)]
            if lh is None:
                custom = {**tags, "spark_writer": writer_id, "partition": str(partition), "attempt": str(attempt)}
                if producer is not None:
                    custom[FORMAT_KEY] = FORMAT_SEQUENCED
                lh = run(client, client.aio.create_ledger(opts.ensemble, opts.write_quorum, opts.ack_quorum,
                                                          opts.digest, opts.password, custom))
            pending = run(client, _append_batch(lh, payloads, pending))
            count += len(payloads)
        if lh is not None:
            run(client, _finish(lh, pending))
    except BaseException:
        if lh is not None:
            _delete_quietly(client, lh.ledger_id)
        raise
    return LedgerWritten(partition, attempt, None if lh is None else lh.ledger_id, count, writer_id, producer)


def _delete_quietly(client: ledgerstore.Client, ledger_id: int) -> None:
    try:
        client.delete_ledger(ledger_id)
    except NoSuchLedgerError:
        pass
    except LedgerStoreError as exc:
        log.warning("could not delete ledger %d (%s): it is an orphan; delete it with `ledgerstore shell`",
                    ledger_id, exc)


def _written(messages: list[WriterCommitMessage | None]) -> list[LedgerWritten]:
    """The tasks' ledgers in the order they join the log: by ledger id. A log's ledger ids must
    increase along it, and tasks create their ledgers in whatever order they start (a retried
    task last), so partition order is kept only where creation order agrees with it."""
    out = sorted((m for m in messages if isinstance(m, LedgerWritten) and m.ledger_id is not None),
                 key=lambda m: (m.ledger_id, m.partition))
    # one ledger per producer: two attempts of a task (speculation) hold the same sequences, and a
    # second copy in the log would be a duplicate; the other attempts' ledgers are swept
    seen: set[str] = set()
    kept = []
    for m in out:
        if m.producer is not None:
            if m.producer in seen:
                continue
            seen.add(m.producer)
        kept.append(m)
    return kept


def highest_ledger_id(client: ledgerstore.Client) -> int:
    return max(client.list_ledgers(), default=-1)


#: ledgers whose metadata this process saw CLOSED; a closed ledger's metadata never changes again
_closed_seen: set[tuple[str, int]] = set()


def ledgers_to_fence(client: ledgerstore.Client, md: LogMetadata) -> list[int]:
    """The ledgers of log ``md`` a commit recovers before appending, in log order: the last two always
    (their writer may still be adding) and every older one whose metadata is not CLOSED (a writer of
    an older release could roll past a ledger it failed to close; a reader stops at such a ledger
    until someone closes it). Ledgers already seen CLOSED are not asked again."""
    uri = client.aio.config.metadata
    older = [lid for lid in md.ledger_ids[:-2] if (uri, lid) not in _closed_seen]

    async def states() -> list[object]:
        answers: list[object] = await asyncio.gather(*(client.aio.ledger_metadata(lid) for lid in older),
                                                     return_exceptions=True)
        return answers

    found = []
    for lid, lmd in zip(older, run(client, states()) if older else [], strict=True):
        if isinstance(lmd, NoSuchLedgerError):
            continue  # deleted under the log (a retention sweep); nothing to fence
        if isinstance(lmd, BaseException):
            raise lmd
        if getattr(lmd, "is_closed", False):
            _closed_seen.add((uri, lid))
        else:
            found.append(lid)
    return [*found, *md.ledger_ids[-2:]]


def commit_to_log(client: ledgerstore.Client, opts: ConnectorOptions, name: str, ledger_ids: list[int],
                  make_extra: Callable[[LogMetadata], list[int] | None] | None = None) -> LogMetadata | None:
    """Append ``ledger_ids`` (closed ledgers) to log ``name`` in one CAS, after fencing its tail.

    ``make_extra(md)`` runs against the metadata the CAS will be checked against; it returns more
    ledger ids to append after ``ledger_ids`` (the streaming marker), or None to commit nothing.
    Returns the log's new metadata, or None if ``make_extra`` declined."""
    for _ in range(COMMIT_ATTEMPTS):
        md = get_or_create_log(client, name)
        if ledger_ids and set(ledger_ids) <= set(md.ledger_ids):
            return md  # an earlier attempt whose answer was lost did land
        for lid in ledgers_to_fence(client, md):
            # what a new leader does: a live writer of this log is fenced and its ledger closed, so
            # the log keeps "one open ledger, the last one" once ours follow
            client.open_ledger(lid, opts.password, recovery=True)
        extra = make_extra(md) if make_extra is not None else []
        if extra is None:
            return None
        ids = [*ledger_ids, *extra]
        last = md.last_ledger_id
        if last is not None and ids and min(ids) <= last:
            raise LogError(
                f"cannot commit to log {name!r}: ledger {last} joined it while this job was writing "
                f"(this job's ledgers start at {min(ids)}), and ledger ids must increase along a log. "
                "Stop other writers of the log while a Spark job writes to it, then run the job again")
        try:
            return append_ledgers(client, md, ids)
        except BadVersionError:
            continue
    raise LogError(f"could not commit to log {name!r}: its ledger list changed {COMMIT_ATTEMPTS} times in a row "
                   "under this commit; is another writer rolling it continuously?")


def sweep(client: ledgerstore.Client, name: str, above: int, match: Callable[[dict[str, str]], bool],
          keep: set[int]) -> list[int]:
    """Delete ledgers with id > ``above`` whose custom metadata ``match``es, except ``keep`` and any
    ledger log ``name`` lists. Returns the deleted ids."""
    md = read_log(client, name)
    keep = keep | (set(md.ledger_ids) if md is not None else set())
    deleted = []
    for lid in client.list_ledgers():
        if lid <= above or lid in keep:
            continue
        try:
            custom = client.ledger_metadata(lid).custom
        except NoSuchLedgerError:
            continue
        if match(custom):
            _delete_quietly(client, lid)
            deleted.append(lid)
    return deleted


class LedgerStoreBatchWriter(DataSourceArrowWriter):
    """``df.write.format("ledgerstore").option("log", ...).mode("append").save()``."""

    def __init__(self, opts: ConnectorOptions, schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise ConfigError("a ledgerstore log is append-only: use mode('append')")
        self.opts = opts
        self.name = opts.require_log("a write")
        self.schema = schema
        payload_column(schema)  # fail on the driver, before any task starts
        self.job_id = uuid.uuid4().hex
        # every ledger this job creates has a higher id: the sweeps only look above this
        self.floor = highest_ledger_id(client_for(opts.metadata))

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return write_task(self.opts, self.schema, iterator, {"spark_job": self.job_id, "log": self.name},
                          self.job_id, sequenced=True)

    def _mine(self, custom: dict[str, str]) -> bool:
        return custom.get("spark_job") == self.job_id

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        client = client_for(self.opts.metadata)
        written = _written(messages)
        ids = [m.ledger_id for m in written if m.ledger_id is not None]
        commit_to_log(client, self.opts, self.name, ids)
        # ledgers of failed or superseded task attempts
        sweep(client, self.name, self.floor, self._mine, set(ids))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        client = client_for(self.opts.metadata)
        sweep(client, self.name, self.floor, self._mine, set())
        # Spark aborts as soon as one task has failed for good; attempts still running elsewhere
        # are killed asynchronously and may create their ledger after the first sweep
        time.sleep(ABORT_GRACE_S)
        sweep(client, self.name, self.floor, self._mine, set())


def _checkpoint_query_id(location: str) -> str | None:
    """The streaming query id Spark keeps in ``<checkpoint>/metadata`` (local checkpoints only)."""
    parsed = urlparse(location)
    if parsed.scheme not in ("", "file"):
        return None
    path = os.path.join(parsed.path if parsed.scheme else location, "metadata")
    try:
        with open(path, encoding="utf-8") as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError):
        return None


class LedgerStoreStreamWriter(DataSourceStreamArrowWriter):
    """``df.writeStream.format("ledgerstore").option("log", ...)``: exactly-once per micro-batch."""

    def __init__(self, opts: ConnectorOptions, schema: StructType) -> None:
        self.opts = opts
        self.name = opts.require_log("a streaming write")
        self.schema = schema
        payload_column(schema)
        self.writer_id = uuid.uuid4().hex

    def sink_id(self) -> str:
        """Who this sink is, across restarts from the same checkpoint: option ``sinkId``, else the
        checkpoint's query id (which a new checkpoint changes, so its epochs start afresh)."""
        if self.opts.sink_id:
            return self.opts.sink_id
        if self.opts.checkpoint_location:
            qid = _checkpoint_query_id(self.opts.checkpoint_location)
            if qid is not None:
                return f"query:{qid}"
        raise ConfigError(
            "the ledgerstore streaming sink needs option 'sinkId' (a name for this query that stays the same "
            "across restarts from its checkpoint), or a local option('checkpointLocation', ...)")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> LedgerWritten:
        return write_task(self.opts, self.schema, iterator, {"spark_sink_data": "1", "log": self.name},
                          self.writer_id)

    def _last_epoch(self, client: ledgerstore.Client, md: LogMetadata, sink: str) -> tuple[int, int]:
        """(newest committed epoch of ``sink`` in the log or -1, its marker's ledger id or -1)."""
        for lid in reversed(md.ledger_ids):
            custom = client.ledger_metadata(lid).custom
            if custom.get("spark_sink") == sink:
                return int(custom["epoch"]), lid
        return -1, -1

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        client = client_for(self.opts.metadata)
        sink = self.sink_id()
        written = _written(messages)
        ids = [m.ledger_id for m in written if m.ledger_id is not None]
        writers = {m.writer for m in messages if isinstance(m, LedgerWritten)}
        if not ids:
            return  # an empty epoch: nothing becomes visible, so there is nothing to deduplicate
        markers: list[int] = []
        # this epoch's task attempts all started after the sink's previous marker was created
        floor = [min(ids) - 1]

        def marker(md: LogMetadata) -> list[int] | None:
            last, previous = self._last_epoch(client, md, sink)
            if previous >= 0:
                floor[0] = min(floor[0], previous)
            if batchId <= last:
                return None
            for lid in markers:  # from a lost CAS: a fresh marker keeps ids increasing
                _delete_quietly(client, lid)
            markers.clear()
            lh = run(client, client.aio.create_ledger(
                self.opts.ensemble, self.opts.write_quorum, self.opts.ack_quorum, self.opts.digest,
                self.opts.password, {"spark_sink": sink, "epoch": str(batchId), "log": self.name}))
            run(client, lh.close())
            markers.append(lh.ledger_id)
            return [lh.ledger_id]

        done = commit_to_log(client, self.opts, self.name, ids, marker)
        if done is None:
            log.info("sink %s: epoch %d of log %s was already committed; discarding this attempt's ledgers",
                     sink, batchId, self.name)
            for lid in ids:
                _delete_quietly(client, lid)
        # failed task attempts of this epoch: same writer instance, not committed
        sweep(client, self.name, floor[0], lambda c: c.get("spark_writer") in writers, set())

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        client = client_for(self.opts.metadata)
        md = read_log(client, self.name)
        listed = set(md.ledger_ids) if md is not None else set()
        for m in _written(messages):
            if m.ledger_id not in listed:
                _delete_quietly(client, m.ledger_id)  # type: ignore[arg-type]


__all__ = ["LedgerStoreBatchWriter", "LedgerStoreStreamWriter", "LedgerWritten", "commit_to_log", "payload_column",
           "sweep"]

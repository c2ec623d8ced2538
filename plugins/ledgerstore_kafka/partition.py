"""One Kafka topic partition on one ledgerstore log: offsets, the index and the tail cache.

Mapping: partition ``p`` of topic ``t`` is the log named :func:`log_name` (``kafka-<t>-<p>``; the
partition number is always the last ``-``-separated part, so the name is unambiguous). Each
record batch a producer sends is one log entry: the batch as sent, its base offset field set to
the offset assigned here (:mod:`ledgerstore_kafka.records`). Offsets are continuous because they
are stored in the entries themselves, never derived from ledger and entry ids.

The broker is the log's writer (``open_log`` fences any previous one). On open it reads the whole
log back once and rebuilds the in-memory index: per stored batch its base offset, last offset,
the running maximum of the batches' max timestamps, and its log position. An offset is found by
binary search over the last offsets; a timestamp by binary search over the running maximum. The
newest batches' bytes are kept in memory (``cache_bytes``); older ones are read from the log at
their position. A batch stays cached, whatever ``cache_bytes`` says, until a log reader can see it:
a reader reads only up to the last-add-confirmed, which travels on the writer's next add, so a
batch is known readable once an add sent after its acknowledgement is acknowledged.

The high watermark is the end of the last batch the log acknowledged; appends are acknowledged
in log order, so batches join the index in offset order. A failed append fails the partition:
every later request is answered ``NOT_LEADER_OR_FOLLOWER`` until the broker reopens the log
(which recovers it: the index then says exactly what is stored).

A batch of an idempotent producer is appended with a sequence, on the log's exactly-once
appends, after Kafka's sequence rules (:mod:`ledgerstore_kafka.producers`, whose state is rebuilt
with the index: each producer's newest epoch from the batch headers, its last sequence from the
log writer's producer table); a retried batch is resolved to the original's base offset.
"""

from __future__ import annotations

import asyncio
import bisect
import collections
import dataclasses
import logging
import re
from collections.abc import Sequence
from typing import Any

from ledgerstore.aio import LogWriter, Position
from ledgerstore.errors import InvalidArgumentError, LedgerStoreError
from ledgerstore_kafka.producers import (
    DUPLICATE_SEQUENCE_NUMBER,
    INVALID_RECORD,
    ProduceRefused,
    ProducerStates,
    log_producer,
)
from ledgerstore_kafka.records import HEADER_SIZE, BatchInfo, parse_batch_header, with_base_offset

__all__ = ["LOG_PREFIX", "LogSettings", "Partition", "PartitionFailed", "log_name", "valid_topic"]

log = logging.getLogger(__name__)

LOG_PREFIX = "kafka-"
#: log names are at most 200 characters: the prefix, the topic, ``-`` and up to 6 digits of partition
MAX_TOPIC_LENGTH = 200 - len(LOG_PREFIX) - 7
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
#: how many entries one read from the log asks for
READ_CHUNK = 500


def valid_topic(topic: str) -> bool:
    """Kafka's topic name rule (``[A-Za-z0-9._-]``, not ``.`` or ``..``) within our log names' length."""
    return (0 < len(topic) <= MAX_TOPIC_LENGTH and _TOPIC.fullmatch(topic) is not None
            and topic not in (".", ".."))


def log_name(topic: str, partition: int) -> str:
    """The log holding partition ``partition`` of ``topic``."""
    return f"{LOG_PREFIX}{topic}-{partition}"


class PartitionFailed(LedgerStoreError):
    """The partition's log writer failed (fenced by another writer, or an add failed)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LogSettings:
    """How the broker opens partition logs (0: the client's default quorum)."""

    password: bytes = b""
    ensemble: int = 0
    write_quorum: int = 0
    ack_quorum: int = 0
    cache_bytes: int = 64 << 20


class Partition:
    """A partition whose log this broker writes. Build with :meth:`open`."""

    def __init__(self, client: Any, topic: str, index: int, settings: LogSettings, writer: LogWriter) -> None:
        self.client = client
        self.topic = topic
        self.index = index
        self.name = log_name(topic, index)
        self.settings = settings
        self.writer = writer
        self.failed: LedgerStoreError | None = None
        self._bases: list[int] = []
        self._lasts: list[int] = []
        self._max_ts: list[int] = []  # running maximum, so it is sorted
        self._positions: list[Position] = []
        self._cache: dict[int, bytes] = {}
        self._cache_order: collections.deque[int] = collections.deque()
        self._cached_bytes = 0
        #: batches [0, _readable) are readable through a log reader; newer ones may still lie
        #: beyond the last-add-confirmed the bookies know, so the cache keeps them
        self._readable = 0
        self.next_offset = 0  # the next offset to assign (ahead of the high watermark while appends fly)
        self.high_watermark = 0
        self._pending: collections.deque[
            tuple[BatchInfo, bytes, asyncio.Future[Position], int, asyncio.Future[int]]] = collections.deque()
        #: idempotent producers' epochs and sequences, rebuilt with the index
        self.producers = ProducerStates()
        #: retried batches answered with their original offset, not written again
        self.duplicates = 0
        self._changed = asyncio.Event()

    @classmethod
    async def open(cls, client: Any, topic: str, index: int, settings: LogSettings) -> Partition:
        """Become the writer of the partition's log (creating it) and rebuild the index from it."""
        quorum = {k: v for k, v in (("ensemble", settings.ensemble), ("write_quorum", settings.write_quorum),
                                    ("ack_quorum", settings.ack_quorum)) if v}
        writer = await client.open_log(log_name(topic, index), password=settings.password, **quorum)
        part = cls(client, topic, index, settings, writer)
        try:
            await part._rebuild()
        except BaseException:
            await writer.close()
            raise
        return part

    async def _rebuild(self) -> None:
        reader = await self.client.open_log_reader(self.name, "earliest", password=self.settings.password)
        self._readable = 1 << 62  # what a reader returns is readable: the cache keeps only cache_bytes
        epochs: dict[int, int] = {}  # idempotent producer -> its newest epoch in the log
        try:
            while batch := await reader.read_batch(READ_CHUNK):
                for position, payload in batch:
                    if len(payload) < HEADER_SIZE:
                        raise PartitionFailed(f"log {self.name!r} holds an entry at {position} that is not a Kafka "
                                              f"record batch ({len(payload)} bytes); it is not a Kafka partition's log")
                    info = parse_batch_header(payload)
                    if info.producer_id >= 0:
                        epochs[info.producer_id] = max(info.producer_epoch, epochs.get(info.producer_id, -1))
                    self._indexed(info, position, payload)
        finally:
            await reader.close()
        self._readable = len(self._bases)
        self.next_offset = self.high_watermark
        for producer_id, epoch in epochs.items():
            self.producers.restore(producer_id, epoch, self.writer.last_seq_of(log_producer(producer_id, epoch)))

    @property
    def log_start_offset(self) -> int:
        return self._bases[0] if self._bases else self.high_watermark

    def _indexed(self, info: BatchInfo, position: Position, stored: bytes) -> None:
        i = len(self._bases)
        self._bases.append(info.base_offset)
        self._lasts.append(info.last_offset)
        self._max_ts.append(max(info.max_timestamp, self._max_ts[-1]) if self._max_ts else info.max_timestamp)
        self._positions.append(position)
        self._cache[i] = stored
        self._cache_order.append(i)
        self._cached_bytes += len(stored)
        self._evict()
        self.high_watermark = info.last_offset + 1

    def _evict(self) -> None:
        while (self._cached_bytes > self.settings.cache_bytes and self._cache_order
               and self._cache_order[0] < self._readable):
            self._cached_bytes -= len(self._cache.pop(self._cache_order.popleft()))

    # --- produce -----------------------------------------------------------------------------

    def append(self, batches: Sequence[bytes]) -> list[asyncio.Future[int]]:
        """Assign offsets to ``batches`` (checked ones, :func:`~ledgerstore_kafka.records.split_batches`)
        and hand them to the log writer, in this call (no await: requests keep their order).
        Returns one future per batch, resolved to its base offset once the log acknowledged it
        (the batch joins the index then). A batch of an idempotent producer is appended with its
        sequence (:mod:`ledgerstore_kafka.producers`); a retried one writes nothing and resolves
        to the original's base offset. :class:`ProduceRefused` for a batch the sequence rules
        refuse (nothing of the request is appended then); :class:`PartitionFailed` once the
        writer failed."""
        if self.failed is not None:
            raise self.failed
        infos = [parse_batch_header(batch) for batch in batches]
        if len(infos) > 1 and any(info.producer_id >= 0 for info in infos):
            raise ProduceRefused("an idempotent produce carries one record batch per partition", INVALID_RECORD)
        verdict = self.producers.check(infos[0]) if infos[0].producer_id >= 0 else None
        futures: list[asyncio.Future[int]] = []
        for batch, info in zip(batches, infos, strict=True):
            if verdict is not None and verdict.duplicate:
                self.duplicates += 1
                again = self.writer.append_async(batch, seq=verdict.seq, producer_id=verdict.producer)
                futures.append(asyncio.ensure_future(self._original_offset(again, info)))
                continue
            info = dataclasses.replace(info, base_offset=self.next_offset)
            self.next_offset = info.last_offset + 1
            stored = with_base_offset(batch, info.base_offset)
            if verdict is None:
                fut = self.writer.append_async(stored)
            else:
                fut = self.writer.append_async(stored, seq=verdict.seq, producer_id=verdict.producer)
            offset: asyncio.Future[int] = asyncio.get_running_loop().create_future()
            # this add carries the writer's last-add-confirmed, which covers every batch acknowledged
            # so far: once it is acknowledged, those are readable through a log reader
            self._pending.append((info, stored, fut, len(self._bases), offset))
            fut.add_done_callback(self._settle)
            futures.append(offset)
        for f in futures:
            f.add_done_callback(_consume)  # the broker reads each outcome; with acks=0 nobody does
        return futures

    async def _original_offset(self, again: asyncio.Future[Position], info: BatchInfo) -> int:
        """The base offset of the stored batch a retried one repeats (its sequences end where the
        retry's do: the log found it by its last sequence). ``DUPLICATE_SEQUENCE_NUMBER`` when no
        stored batch holds exactly the retry's sequences."""
        try:
            position = await again
        except InvalidArgumentError as exc:  # the last sequence lies inside a stored batch
            raise ProduceRefused(f"a retried batch matches no stored batch: {exc}", DUPLICATE_SEQUENCE_NUMBER) from None
        while True:  # an original still in flight joins the index when acknowledged
            i = bisect.bisect_left(self._positions, position)
            if i < len(self._positions) and self._positions[i] == position:
                if self._lasts[i] - self._bases[i] != info.last_offset_delta:
                    raise ProduceRefused(f"a retried batch of {info.record_count} records matches a stored batch of "
                                         f"{self._lasts[i] - self._bases[i] + 1}", DUPLICATE_SEQUENCE_NUMBER)
                return self._bases[i]
            if self.failed is not None:
                raise self.failed
            await self._changed.wait()

    def _settle(self, _done: asyncio.Future[Position]) -> None:
        # the writer acknowledges in log order, but callbacks run one by one: index every batch
        # from the front that is done, so the index never has a hole
        while self._pending and self._pending[0][2].done():
            info, stored, fut, covers, offset = self._pending.popleft()
            if fut.cancelled() or fut.exception() is not None:
                err = fut.exception() if not fut.cancelled() else None
                self.failed = PartitionFailed(f"the log {self.name!r} refused an append: {err or 'cancelled'}")
                self._changed.set()
                offset.set_exception(self.failed)
                for _, _, later, _, later_offset in self._pending:  # they fail too (no acknowledgement follows)
                    later.add_done_callback(_consume)
                    later_offset.set_exception(self.failed)
                self._pending.clear()
                return
            self._readable = max(self._readable, covers)
            self._indexed(info, fut.result(), stored)
            offset.set_result(info.base_offset)
            self._changed.set()
        self._changed = asyncio.Event() if self._changed.is_set() else self._changed

    async def wait_for_data(self, timeout: float) -> None:
        """Return when a batch was acknowledged (or the partition failed), or after ``timeout``."""
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except TimeoutError:
            pass

    @property
    def changed(self) -> asyncio.Event:
        """Set when the high watermark moves (a new event each time)."""
        return self._changed

    # --- fetch and list offsets --------------------------------------------------------------

    async def read(self, offset: int, max_bytes: int) -> bytes:
        """Whole batches from the one holding ``offset``, up to ``max_bytes`` (but at least one
        batch). Empty at the high watermark. The caller checks the offset's range first."""
        i = bisect.bisect_left(self._lasts, offset)
        out: list[bytes] = []
        size, j = 0, i
        while j < len(self._lasts) and (not out or size < max_bytes):
            stored = self._cache.get(j)
            run = [stored] if stored is not None else await self._read_from_log(j, max_bytes - size)
            for batch in run:
                if out and size + len(batch) > max_bytes:
                    return b"".join(out)
                out.append(batch)
                size += len(batch)
            j += len(run)
        return b"".join(out)

    async def _read_from_log(self, j: int, max_bytes: int) -> list[bytes]:
        """Batches ``j``, ``j + 1``, ... read from the log with one reader, up to the first cached
        one or about ``max_bytes`` (at least one)."""
        end = j + 1
        while end < len(self._positions) and end not in self._cache and end - j < READ_CHUNK:
            end += 1
        reader = await self.client.open_log_reader(self.name, self._positions[j], password=self.settings.password)
        out: list[bytes] = []
        size = 0
        try:
            while len(out) < end - j and (not out or size < max_bytes):
                got = await reader.read_batch(min(end - j - len(out), 100))
                if not got:
                    break
                for _, payload in got:
                    out.append(bytes(payload))
                    size += len(payload)
        finally:
            await reader.close()
        if not out:
            raise PartitionFailed(f"log {self.name!r} did not return the entry at {self._positions[j]}")
        return out

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """``(offset, timestamp)`` of the first batch holding a record at or after ``timestamp``
        (batch granularity: its base offset and its max timestamp), or ``None`` if none does."""
        i = bisect.bisect_left(self._max_ts, timestamp)
        if i >= len(self._max_ts):
            return None
        return self._bases[i], self._max_ts[i]

    async def close(self) -> None:
        """Close the log writer (waits for appends in flight)."""
        try:
            await self.writer.close()
        except LedgerStoreError as exc:
            log.warning("closing partition log %r: %s", self.name, exc)


def _consume(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled():
        fut.exception()  # retrieved: the failure is the partition's, already reported

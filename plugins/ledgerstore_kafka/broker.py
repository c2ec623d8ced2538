"""The Kafka broker: connections, request dispatch by API key, and what each request does.

Each connection reads size-prefixed requests and answers them in order (Kafka's rule). A request
is handled in a task of its own as soon as it is read, so a producer's pipelined requests overlap
(their appends reach the log in the order they were read: :meth:`Partition.append` does not
await); a writer task sends the answers in request order. A frame larger than
``max_request_bytes``, a request too short for its header, or a body that does not parse closes
that connection only (the error is counted and logged in one line). An API or version not served
closes the connection too, except ApiVersions, which is answered in v0 with
``UNSUPPORTED_VERSION`` and the versions served, as Kafka's protocol prescribes.

With SASL on (:mod:`ledgerstore_kafka.sasl`) each connection has a :class:`SaslSession`: until it
has authenticated only ApiVersions, SaslHandshake and SaslAuthenticate are served (anything else
closes the connection), a SASL request is answered before the next request is read (the answer
decides how the next one is framed, or that the connection closes), and ApiVersions lists the
two SASL APIs.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from ledgerstore.errors import LedgerStoreError
from ledgerstore_kafka.admin import AdminSettings, TopicAdmin
from ledgerstore_kafka.admin_messages import (
    AdminApiKey,
    decode_create_topics,
    decode_delete_topics,
    decode_describe_configs,
    encode_create_topics,
    encode_delete_topics,
    encode_describe_configs,
    encode_txn_refusal,
)
from ledgerstore_kafka.brokers import BrokerRegistry
from ledgerstore_kafka.codec import MalformedRequest, Reader
from ledgerstore_kafka.group_messages import (
    GroupApiKey,
    decode_find_coordinator,
    decode_heartbeat,
    decode_join_group,
    decode_leave_group,
    decode_offset_commit,
    decode_offset_fetch,
    decode_sync_group,
    encode_error_only,
    encode_find_coordinator,
    encode_join_group,
    encode_offset_commit,
    encode_offset_fetch,
    encode_sync_group,
)
from ledgerstore_kafka.groups import GroupCoordinator
from ledgerstore_kafka.messages import (
    API_NAMES,
    EARLIEST,
    LATEST,
    SUPPORTED,
    UNSERVED,
    ApiKey,
    ErrorCode,
    FetchPartitionResult,
    FetchRequest,
    ListOffsetsResult,
    ProducePartitionResult,
    RequestHeader,
    TopicMetadata,
    decode_fetch,
    decode_init_producer_id,
    decode_list_offsets,
    decode_metadata,
    decode_produce,
    encode_api_versions,
    encode_fetch,
    encode_init_producer_id,
    encode_list_offsets,
    encode_metadata,
    encode_produce,
    response_frame,
)
from ledgerstore_kafka.partition import LOG_PREFIX, LogSettings, Partition, PartitionFailed, valid_topic
from ledgerstore_kafka.producers import ProduceRefused
from ledgerstore_kafka.records import BatchError, split_batches
from ledgerstore_kafka.sasl import MAX_RAW_TOKEN, SaslSession, SaslSettings
from ledgerstore_kafka.sasl_messages import SASL_SUPPORTED

__all__ = ["Broker", "BrokerSettings"]

log = logging.getLogger(__name__)

#: Kafka's answer from a broker that does not coordinate the group asked about
NOT_COORDINATOR = 16

#: the metadata store's counter Kafka producer ids come from
PRODUCER_ID_COUNTER = "kafka_producer_id"

#: how many answered-but-unsent responses a connection may hold before it stops reading requests
MAX_IN_FLIGHT = 100

#: seconds between the answer to a refused SASL exchange and the close of its connection: Kafka's
#: connection.failed.authentication.delay.ms (100 ms). It slows password guessing, and a client
#: reads the answer before the close: kafka-python 3 drops bytes that arrive with the close in one
#: read, and so reported a lost connection instead of SASL_AUTHENTICATION_FAILED
FAILED_AUTHENTICATION_DELAY = 0.1

#: a request's correlation id (``None``: an unframed SASL token) and the task computing its answer
Answer = tuple[int | None, asyncio.Task[bytes | None]]


@dataclasses.dataclass(frozen=True, slots=True)
class BrokerSettings:
    """What the broker needs of the handler's options (see ``KafkaHandler.Options``)."""

    node_id: int
    cluster_id: str
    auto_create_topics: bool
    num_partitions: int
    max_batch_bytes: int
    max_request_bytes: int
    logs: LogSettings
    #: SASL's mechanisms and users; ``None``: clients are not authenticated
    sasl: SaslSettings | None = None


class Broker:
    """Serves Kafka requests over partitions held as ledgerstore logs."""

    def __init__(self, client: Any, settings: BrokerSettings) -> None:
        self.client = client
        self.settings = settings
        self.advertised: tuple[str, int] = ("127.0.0.1", 0)
        self.partitions: dict[tuple[str, int], Partition] = {}
        self._opening: dict[tuple[str, int], asyncio.Lock] = collections.defaultdict(asyncio.Lock)
        self.connections: set[asyncio.Task[None]] = set()
        self.counters: collections.Counter[str] = collections.Counter()
        #: the APIs served with their versions (ApiVersions' answer): the SASL ones when SASL is on
        self.served: dict[int, tuple[int, int]] = {**SUPPORTED, **(SASL_SUPPORTED if settings.sasl else {})}
        self.handlers: dict[int, Callable[[Reader, int], Coroutine[Any, Any, bytes | None]]] = {
            ApiKey.API_VERSIONS: self.api_versions,
            ApiKey.METADATA: self.metadata,
            ApiKey.PRODUCE: self.produce,
            ApiKey.FETCH: self.fetch,
            ApiKey.LIST_OFFSETS: self.list_offsets,
            ApiKey.INIT_PRODUCER_ID: self.init_producer_id,
            GroupApiKey.FIND_COORDINATOR: self.find_coordinator,
            GroupApiKey.JOIN_GROUP: self.join_group,
            GroupApiKey.SYNC_GROUP: self.sync_group,
            GroupApiKey.HEARTBEAT: self.heartbeat,
            GroupApiKey.LEAVE_GROUP: self.leave_group,
            GroupApiKey.OFFSET_COMMIT: self.offset_commit,
            GroupApiKey.OFFSET_FETCH: self.offset_fetch,
            AdminApiKey.CREATE_TOPICS: self.create_topics,
            AdminApiKey.DELETE_TOPICS: self.delete_topics,
            AdminApiKey.DESCRIBE_CONFIGS: self.describe_configs,
        }
        for key in UNSERVED:
            self.handlers[key] = functools.partial(self.refuse_transaction, key)
        self.groups = GroupCoordinator(client, settings.logs.password)
        #: the role and the lease's generation as the last group request saw them (a broker that
        #: lost its lease while frozen may never have seen another coordinator named)
        self._coordinated = (False, 0)
        #: the live brokers and the partitions' leaders (ledgerstore_kafka.brokers)
        self.registry = BrokerRegistry(client.store, settings.node_id)
        self.admin = TopicAdmin(client, AdminSettings(
            settings.node_id, settings.num_partitions, settings.max_batch_bytes, settings.max_request_bytes,
            settings.auto_create_topics, settings.logs.ensemble, settings.logs.password),
            self.topics, self.create_topic, self.forget_topic)

    # --- connections -------------------------------------------------------------------------

    async def serve_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests until the peer closes or sends something unparsable; answer in order."""
        self.counters["connections_total"] += 1
        answers: asyncio.Queue[Answer | None] = asyncio.Queue(MAX_IN_FLIGHT)
        sender = asyncio.create_task(self._send_answers(answers, writer))
        peer = writer.get_extra_info("peername")
        sasl = SaslSession(self.settings.sasl, peer) if self.settings.sasl is not None else None
        try:
            while not sender.done():
                if sasl is not None and sasl.unframed and not sasl.authenticated:
                    if not await self._unframed_token(reader, answers, sasl):
                        break
                    continue
                try:
                    size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                if size < 8 or size > self.settings.max_request_bytes:
                    self._refuse(peer, f"a request frame of {size} bytes (allowed 8..{self.settings.max_request_bytes})")
                    break
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    self._refuse(peer, "a request cut short (the connection closed inside it)")
                    break
                task = self._dispatch(frame, peer, sasl)
                if task is None:
                    break
                await answers.put(task)
                if sasl is not None and not sasl.authenticated:
                    await asyncio.wait([task[1]])  # the answer decides what may come next
                    if sasl.closing:
                        break
        finally:
            try:
                if sender.done():
                    _cancel_queued(answers)
                else:
                    await answers.put(None)
                    with contextlib.suppress(ConnectionError):
                        await sender
                if sasl is not None and sasl.closing:
                    await asyncio.sleep(FAILED_AUTHENTICATION_DELAY)
            finally:
                writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def _unframed_token(self, reader: asyncio.StreamReader, answers: asyncio.Queue[Answer | None],
                              sasl: SaslSession) -> bool:
        """Read and answer one SASL token sent unframed (after a SaslHandshake v0); ``False``
        when the connection is to close."""
        try:
            size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
            if not 0 <= size <= MAX_RAW_TOKEN:
                self._refuse(sasl.peer, f"a SASL token of {size} bytes (allowed 0..{MAX_RAW_TOKEN})")
                return False
            token = await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        answer = await sasl.unframed_token(token)
        self._count_sasl(sasl)
        if answer is None:
            return False
        await answers.put((None, asyncio.create_task(_ready(answer))))
        return True

    def _count_sasl(self, sasl: SaslSession) -> None:
        if sasl.closing:
            self.counters["sasl_failures_total"] += 1
        elif sasl.authenticated:
            self.counters["sasl_authentications_total"] += 1

    def _refuse(self, peer: object, what: str) -> None:
        self.counters["bad_requests_total"] += 1
        log.info("closing the Kafka connection from %s: %s", peer, what)

    def _dispatch(self, frame: bytes, peer: object, sasl: SaslSession | None) -> Answer | None:
        api_key, version, correlation_id = RequestHeader.peek(frame)
        if sasl is not None and not sasl.allows(api_key):
            self.counters["sasl_failures_total"] += 1
            self._refuse(peer, f"API key {api_key} before SASL authentication")
            return None
        served = self.served.get(api_key) or UNSERVED.get(api_key)
        if api_key == ApiKey.API_VERSIONS and served is not None and not served[0] <= version <= served[1]:
            self.counters["unsupported_version_total"] += 1
            return correlation_id, asyncio.create_task(_ready(
                encode_api_versions(0, ErrorCode.UNSUPPORTED_VERSION, self.served)))
        if served is None or not served[0] <= version <= served[1]:
            self.counters["unsupported_version_total"] += 1
            self._refuse(peer, f"API key {api_key} version {version}, which this broker does not serve")
            return None
        r = Reader(frame)
        try:
            RequestHeader.decode(r)
        except MalformedRequest as exc:
            self._refuse(peer, f"a bad request header: {exc}")
            return None
        self.counters[f"requests_total{{api=\"{API_NAMES[api_key]}\"}}"] += 1
        if api_key in SASL_SUPPORTED and sasl is not None:
            return correlation_id, asyncio.create_task(self._sasl(sasl, api_key, r, version))
        return correlation_id, asyncio.create_task(self.handlers[api_key](r, version))

    async def _sasl(self, sasl: SaslSession, api_key: int, r: Reader, version: int) -> bytes:
        body = await sasl.handle(api_key, r, version)
        self._count_sasl(sasl)
        return body

    async def _send_answers(self, answers: asyncio.Queue[Answer | None], writer: asyncio.StreamWriter) -> None:
        while (item := await answers.get()) is not None:
            correlation_id, task = item
            try:
                body = await task
            except MalformedRequest as exc:
                self._refuse(writer.get_extra_info("peername"), f"a request that does not parse: {exc}")
                writer.close()
                _cancel_queued(answers)
                return
            except LedgerStoreError as exc:  # the cluster failed under the request: this connection ends
                self.counters["failed_requests_total"] += 1
                log.warning("closing the Kafka connection from %s: a request failed: %s",
                            writer.get_extra_info("peername"), exc)
                writer.close()
                _cancel_queued(answers)
                return
            if body is None:  # acks=0: no answer
                continue
            frame = response_frame(correlation_id, body) if correlation_id is not None else _unframed(body)
            self.counters["bytes_out_total"] += len(frame)
            writer.write(frame)
            with contextlib.suppress(ConnectionError):
                await writer.drain()

    # --- partitions --------------------------------------------------------------------------

    async def topics(self) -> dict[str, int]:
        """Every topic with its partition count, from the logs named ``kafka-<topic>-<n>``."""
        found: dict[str, set[int]] = collections.defaultdict(set)
        for name in await self.client.list_logs():
            if name.startswith(LOG_PREFIX):
                topic, _, number = name[len(LOG_PREFIX):].rpartition("-")
                if topic and number.isdigit():
                    found[topic].add(int(number))
        out = {}
        for topic, numbers in found.items():
            n = 0
            while n in numbers:
                n += 1
            if n:
                out[topic] = n
        return out

    async def partition(self, topic: str, index: int) -> Partition:
        """The open partition, opened (as the log's writer) on first use or after it failed."""
        key = (topic, index)
        async with self._opening[key]:
            part = self.partitions.get(key)
            if part is not None and part.failed is None:
                return part
            if part is not None:
                del self.partitions[key]
                await part.close()
            part = await Partition.open(self.client, topic, index, self.settings.logs)
            self.partitions[key] = part
            return part

    async def create_topic(self, topic: str, partitions: int) -> None:
        """Create a topic: open (and so create) each of its partitions' logs."""
        for i in range(partitions):
            await self.partition(topic, i)

    async def forget_topic(self, topic: str) -> None:
        """Close the partitions of ``topic`` this broker has open (before its logs are deleted)."""
        for key in [k for k in self.partitions if k[0] == topic]:
            await self._release(key)

    async def _release(self, key: tuple[str, int]) -> None:
        """Close a partition this broker has open, if it has."""
        if key not in self.partitions:
            return
        async with self._opening[key]:
            part = self.partitions.pop(key, None)
            if part is not None:
                await part.close()

    # --- requests ----------------------------------------------------------------------------

    async def api_versions(self, r: Reader, version: int) -> bytes:
        return encode_api_versions(version, ErrorCode.NONE, self.served)

    async def metadata(self, r: Reader, version: int) -> bytes:
        req = decode_metadata(r, version)
        known = await self.topics()
        answers = []
        if req.topics is None:
            answers = [TopicMetadata(t, ErrorCode.NONE, n) for t, n in sorted(known.items())]
        for topic in req.topics or []:
            if not valid_topic(topic):
                answers.append(TopicMetadata(topic, ErrorCode.INVALID_TOPIC_EXCEPTION, 0))
            elif topic in known:
                answers.append(TopicMetadata(topic, ErrorCode.NONE, known[topic]))
            elif self.settings.auto_create_topics and req.allow_auto_topic_creation:
                await self.create_topic(topic, self.settings.num_partitions)
                answers.append(TopicMetadata(topic, ErrorCode.NONE, self.settings.num_partitions))
            else:
                answers.append(TopicMetadata(topic, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, 0))
        brokers = [(node, *self.registry.address(node)) for node in sorted(self.registry.live)]
        return encode_metadata(version, brokers, self.registry.coordinator(), self.settings.cluster_id, answers,
                               self.registry.leader)

    async def _known_partition(self, topic: str, index: int, known: dict[str, int]) -> Partition | int:
        """The partition, or the error code to answer for it."""
        if not valid_topic(topic):
            return ErrorCode.INVALID_TOPIC_EXCEPTION
        if index < 0 or index >= known.get(topic, 0):
            return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
        if self.registry.leader(topic, index) != self.settings.node_id:
            await self._release((topic, index))  # another broker leads it now
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        try:
            return await self.partition(topic, index)
        except LedgerStoreError as exc:
            log.warning("partition %s-%d cannot be opened: %s", topic, index, exc)
            return ErrorCode.NOT_LEADER_OR_FOLLOWER

    async def produce(self, r: Reader, version: int) -> bytes | None:
        req = decode_produce(r, version)
        known = await self.known_partitions([(t, i) for t, parts in req.topics for i, _ in parts])
        results: list[tuple[str, list[ProducePartitionResult]]] = []
        waits: list[tuple[ProducePartitionResult, list[asyncio.Future[int]]]] = []
        for topic, parts in req.topics:
            out: list[ProducePartitionResult] = []
            for index, records in parts:
                out.append(await self._produce_one(req.acks, req.transactional_id, topic, index, records, known, waits))
            results.append((topic, out))
        if req.acks == 0:
            return None
        done = await self._await_appends(waits, req.timeout_ms / 1000)
        final = [(topic, [done.get(id(p), p) for p in parts]) for topic, parts in results]
        return encode_produce(version, final)

    async def known_partitions(self, wanted: list[tuple[str, int]]) -> dict[str, int]:
        """Partition counts good for every ``(topic, partition)`` of ``wanted``: from the
        partitions this broker has open when they cover them (a produce or fetch of open
        partitions costs no metadata read), else from the logs (:meth:`topics`)."""
        if all(key in self.partitions for key in wanted):
            counts: dict[str, int] = collections.defaultdict(int)
            for topic, index in self.partitions:
                counts[topic] = max(counts[topic], index + 1)
            return counts
        return await self.topics()

    async def _produce_one(self, acks: int, transactional_id: str | None, topic: str, index: int,
                           records: bytes | None, known: dict[str, int],
                           waits: list[tuple[ProducePartitionResult, list[asyncio.Future[int]]]]) -> ProducePartitionResult:
        if acks not in (-1, 0, 1):
            return ProducePartitionResult(index, ErrorCode.INVALID_REQUIRED_ACKS)
        if transactional_id is not None:
            return ProducePartitionResult(index, ErrorCode.INVALID_RECORD, message="transactions are not supported")
        part = await self._known_partition(topic, index, known)
        if isinstance(part, int):
            return ProducePartitionResult(index, part)
        try:
            batches = split_batches(records or b"", self.settings.max_batch_bytes)
        except BatchError as exc:
            self.counters["produce_rejected_total"] += 1
            return ProducePartitionResult(index, exc.error_code, message=str(exc))
        duplicates = part.duplicates
        try:
            futures = part.append(batches)
        except ProduceRefused as exc:
            self.counters["produce_rejected_total"] += 1
            return ProducePartitionResult(index, exc.error_code, message=str(exc))
        except PartitionFailed:
            return ProducePartitionResult(index, ErrorCode.NOT_LEADER_OR_FOLLOWER)
        if part.duplicates > duplicates:  # rare: a producer retried after a lost answer
            self.counters["produce_duplicates_total"] += part.duplicates - duplicates
            log.info("a retried batch for %s-%d is answered with its original offset (not written again)", topic, index)
        self.counters["produce_batches_total"] += len(batches)
        self.counters["bytes_in_total"] += sum(len(b) for b in batches)
        result = ProducePartitionResult(index, ErrorCode.NONE, -1, part.log_start_offset)
        waits.append((result, futures))
        return result

    async def _await_appends(self, waits: list[tuple[ProducePartitionResult, list[asyncio.Future[int]]]],
                             timeout: float) -> dict[int, ProducePartitionResult]:
        """Wait for the log's acknowledgements (its ack quorum) and answer each partition with its
        first batch's base offset; a partition whose appends failed is answered
        ``NOT_LEADER_OR_FOLLOWER`` (or the sequence rules' code), one not acknowledged in time
        ``REQUEST_TIMED_OUT``."""
        changed: dict[int, ProducePartitionResult] = {}
        if not waits:
            return changed
        all_futures = [f for _, fs in waits for f in fs]
        await asyncio.wait(all_futures, timeout=max(timeout, 0.001))
        for result, futures in waits:
            p = result.partition
            if not all(f.done() for f in futures):
                changed[id(result)] = ProducePartitionResult(p, ErrorCode.REQUEST_TIMED_OUT)
                continue
            errors = [f.exception() if not f.cancelled() else PartitionFailed("cancelled") for f in futures]
            refused = next((e for e in errors if isinstance(e, ProduceRefused)), None)
            if refused is not None:
                changed[id(result)] = ProducePartitionResult(p, refused.error_code, message=str(refused))
            elif any(e is not None for e in errors):
                changed[id(result)] = ProducePartitionResult(p, ErrorCode.NOT_LEADER_OR_FOLLOWER)
            else:
                changed[id(result)] = dataclasses.replace(result, base_offset=futures[0].result())
        return changed

    async def fetch(self, r: Reader, version: int) -> bytes:
        req = decode_fetch(r, version)
        deadline = time.monotonic() + max(req.max_wait_ms, 0) / 1000
        known = await self.known_partitions([(t, fp.partition) for t, parts in req.topics for fp in parts])
        while True:
            results, size, waiting = await self._fetch_once(req, known)
            remaining = deadline - time.monotonic()
            if size >= max(req.min_bytes, 1) or remaining <= 0 or not waiting:
                return encode_fetch(version, ErrorCode.NONE, results)
            self.counters["fetch_waits_total"] += 1
            # long-poll: woken by the first acknowledged append on any partition asked for
            waiters = [asyncio.ensure_future(ev.wait()) for ev in waiting]
            try:
                await asyncio.wait(waiters, timeout=remaining, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()

    async def _fetch_once(self, req: FetchRequest, known: dict[str, int]
                          ) -> tuple[list[tuple[str, list[FetchPartitionResult]]], int, list[asyncio.Event]]:
        results = []
        size = 0
        waiting: list[asyncio.Event] = []
        budget = req.max_bytes if req.max_bytes > 0 else 1 << 30
        for topic, parts in req.topics:
            out = []
            for fp in parts:
                part = await self._known_partition(topic, fp.partition, known)
                if isinstance(part, int):
                    out.append(FetchPartitionResult(fp.partition, part))
                    continue
                changed = part.changed
                hw, start = part.high_watermark, part.log_start_offset
                if fp.fetch_offset < start or fp.fetch_offset > hw:
                    out.append(FetchPartitionResult(fp.partition, ErrorCode.OFFSET_OUT_OF_RANGE, hw, start))
                    continue
                records = b""
                if fp.fetch_offset < hw and budget > 0:
                    try:
                        records = await part.read(fp.fetch_offset, min(fp.max_bytes, budget))
                    except LedgerStoreError as exc:
                        log.warning("fetch from %s at %d failed: %s", part.name, fp.fetch_offset, exc)
                        out.append(FetchPartitionResult(fp.partition, ErrorCode.NOT_LEADER_OR_FOLLOWER))
                        continue
                budget -= len(records)
                size += len(records)
                if not records:
                    waiting.append(changed)
                out.append(FetchPartitionResult(fp.partition, ErrorCode.NONE, hw, start, records))
            results.append((topic, out))
        self.counters["fetch_bytes_total"] += size
        return results, size, waiting

    async def list_offsets(self, r: Reader, version: int) -> bytes:
        req = decode_list_offsets(r, version)
        known = await self.known_partitions([(t, i) for t, parts in req.topics for i, _ in parts])
        results = []
        for topic, parts in req.topics:
            out = []
            for index, timestamp in parts:
                part = await self._known_partition(topic, index, known)
                if isinstance(part, int):
                    out.append(ListOffsetsResult(index, part))
                elif timestamp == LATEST:
                    out.append(ListOffsetsResult(index, ErrorCode.NONE, -1, part.high_watermark))
                elif timestamp == EARLIEST:
                    out.append(ListOffsetsResult(index, ErrorCode.NONE, -1, part.log_start_offset))
                elif timestamp < 0:
                    out.append(ListOffsetsResult(index, ErrorCode.INVALID_REQUEST))
                else:
                    found = part.offset_for_timestamp(timestamp)
                    offset, ts = found if found is not None else (-1, -1)
                    out.append(ListOffsetsResult(index, ErrorCode.NONE, ts, offset))
            results.append((topic, out))
        return encode_list_offsets(version, results)

    async def init_producer_id(self, r: Reader, version: int) -> bytes:
        """A new producer id, epoch 0, for an idempotent producer: the metadata store's counter
        :data:`PRODUCER_ID_COUNTER` hands each value out once, across brokers and restarts.
        Transactional producers are not served: a transactional id is answered
        ``TRANSACTIONAL_ID_AUTHORIZATION_FAILED`` (no transactional id is granted here), which
        clients treat as fatal at once; ``UNSUPPORTED_VERSION`` made librdkafka retry every half
        second until its ``init_transactions`` timeout."""
        if decode_init_producer_id(r, version) is not None:
            return encode_init_producer_id(version, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1, -1)
        producer_id = await self.client.store.next_id(PRODUCER_ID_COUNTER)
        return encode_init_producer_id(version, ErrorCode.NONE, producer_id, 0)

    # --- topic administration (ledgerstore_kafka.admin) and transactions ------------------------

    async def create_topics(self, r: Reader, version: int) -> bytes:
        return encode_create_topics(version, await self.admin.create_topics(*decode_create_topics(r, version)))

    async def delete_topics(self, r: Reader, version: int) -> bytes:
        return encode_delete_topics(version, await self.admin.delete_topics(decode_delete_topics(r, version)))

    async def describe_configs(self, r: Reader, version: int) -> bytes:
        return encode_describe_configs(version, await self.admin.describe_configs(decode_describe_configs(r, version)))

    async def refuse_transaction(self, api_key: int, r: Reader, version: int) -> bytes:
        """Transactions are not served: every part of the answer is ``UNSUPPORTED_VERSION``."""
        return encode_txn_refusal(api_key, r, version, ErrorCode.UNSUPPORTED_VERSION)

    # --- consumer groups (ledgerstore_kafka.groups) ---------------------------------------------

    async def find_coordinator(self, r: Reader, version: int) -> bytes:
        """This broker coordinates every group, and is named for transactions too: a transactional
        producer then asks it for a producer id and is refused at once (``UNSUPPORTED_VERSION``)
        instead of looking for a coordinator until its timeout."""
        decode_find_coordinator(r, version)
        node = self.registry.coordinator()
        return encode_find_coordinator(version, ErrorCode.NONE, node, *self.registry.address(node))

    @property
    def coordinating(self) -> bool:
        """Whether this broker coordinates the groups now; the others answer ``NOT_COORDINATOR``,
        so a client asks FindCoordinator again."""
        return self.registry.coordinator() == self.settings.node_id

    async def _coordinates(self) -> bool:
        """:attr:`coordinating`, and on a change of role, or once this broker had to take its lease
        again, the groups' state is dropped: a broker that coordinated, lost the role and regains
        it reads the groups' log again instead of answering from what it held before (offsets
        committed meanwhile through another coordinator were missing), and one that lost it lets
        go of the log."""
        now = (self.coordinating, self.registry.lease_generation)
        if now != self._coordinated:
            self._coordinated = now
            await self.groups.forget()
        return now[0]

    async def join_group(self, r: Reader, version: int) -> bytes:
        req = decode_join_group(r, version)
        if not await self._coordinates():
            return encode_join_group(version, NOT_COORDINATOR, -1, "", "", "", [])
        j = await self.groups.join(req, None)
        return encode_join_group(version, j.error, j.generation, j.protocol, j.leader, j.member_id, j.members)

    async def sync_group(self, r: Reader, version: int) -> bytes:
        req = decode_sync_group(r, version)
        if not await self._coordinates():
            return encode_sync_group(version, NOT_COORDINATOR, b"")
        error, assignment = await self.groups.sync(req)
        return encode_sync_group(version, error, assignment)

    async def heartbeat(self, r: Reader, version: int) -> bytes:
        req = decode_heartbeat(r, version)
        return encode_error_only(version, await self.groups.heartbeat(*req) if await self._coordinates() else NOT_COORDINATOR)

    async def leave_group(self, r: Reader, version: int) -> bytes:
        req = decode_leave_group(r, version)
        return encode_error_only(version, await self.groups.leave(*req) if await self._coordinates() else NOT_COORDINATOR)

    async def offset_commit(self, r: Reader, version: int) -> bytes:
        req = decode_offset_commit(r, version)
        if not await self._coordinates():
            return encode_offset_commit(version, [(t, [(p[0], NOT_COORDINATOR) for p in ps]) for t, ps in req.topics])
        return encode_offset_commit(version, await self.groups.commit(req))

    async def offset_fetch(self, r: Reader, version: int) -> bytes:
        group_id, topics = decode_offset_fetch(r, version)
        if not await self._coordinates():
            return encode_offset_fetch(version, NOT_COORDINATOR,
                                       [(t, [(i, -1, None, NOT_COORDINATOR) for i in ps]) for t, ps in topics or []])
        return encode_offset_fetch(version, 0, await self.groups.fetch_offsets(group_id, topics))

    async def close(self) -> None:
        """Close every partition's log writer and the groups' log."""
        parts, self.partitions = list(self.partitions.values()), {}
        for part in parts:
            await part.close()
        await self.groups.close()


async def _ready(body: bytes) -> bytes:
    return body


def _unframed(body: bytes) -> bytes:
    """A SASL token answered unframed (after a SaslHandshake v0): its size and itself."""
    return len(body).to_bytes(4, "big") + body


def _cancel_queued(answers: asyncio.Queue[Answer | None]) -> None:
    """Cancel the requests still queued on a connection that is closing (their answers would
    have nowhere to go), and retrieve what the finished ones raised."""
    while not answers.empty():
        item = answers.get_nowait()
        if item is not None:
            task = item[1]
            task.cancel()
            task.add_done_callback(_retrieve)


def _retrieve(task: asyncio.Task[bytes | None]) -> None:
    if not task.cancelled():
        task.exception()

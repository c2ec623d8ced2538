"""The Kafka requests and responses this front end speaks, at the versions in :data:`SUPPORTED`.

Decoding and encoding only (pure functions over bytes, :mod:`ledgerstore_kafka.codec`); what a
request does is in :mod:`ledgerstore_kafka.broker`. Every version served is a non-flexible one, so
requests carry header v1 (API key, version, correlation id, client id) and responses header v0
(the correlation id). Field lists follow Kafka's message schemas
(``clients/src/main/resources/common/message/*.json``); a field marked "vN+" is present from that
version on.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping

from ledgerstore_kafka.admin_messages import ADMIN_SUPPORTED, TXN_SUPPORTED
from ledgerstore_kafka.codec import MalformedRequest, Reader, Writer
from ledgerstore_kafka.group_messages import GROUP_SUPPORTED

__all__ = [
    "API_NAMES", "SUPPORTED", "ApiKey", "ErrorCode", "FetchPartition", "FetchRequest", "ListOffsetsRequest", "MetadataRequest",
    "ProduceRequest", "RequestHeader",
]


class ApiKey(enum.IntEnum):
    """Kafka's API keys for the APIs served here."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    API_VERSIONS = 18
    INIT_PRODUCER_ID = 22


class ErrorCode(enum.IntEnum):
    """Kafka's error codes used in answers."""

    UNKNOWN_SERVER_ERROR = -1
    NONE = 0
    OFFSET_OUT_OF_RANGE = 1
    CORRUPT_MESSAGE = 2
    UNKNOWN_TOPIC_OR_PARTITION = 3
    NOT_LEADER_OR_FOLLOWER = 6
    REQUEST_TIMED_OUT = 7
    MESSAGE_TOO_LARGE = 10
    INVALID_TOPIC_EXCEPTION = 17
    INVALID_REQUIRED_ACKS = 21
    UNSUPPORTED_VERSION = 35
    INVALID_REQUEST = 42
    OUT_OF_ORDER_SEQUENCE_NUMBER = 45
    DUPLICATE_SEQUENCE_NUMBER = 46
    INVALID_PRODUCER_EPOCH = 47
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53
    KAFKA_STORAGE_ERROR = 56
    INVALID_RECORD = 87


#: API key -> (lowest, highest) version served: the one table ApiVersions answers from. Produce from v3 and Fetch from v4 (record batches,
#: magic 2: the Kafka 2.1 baseline that Kafka 4 keeps, KIP-896); every version here is non-flexible
#: (the flexible ones, Produce v9, Fetch v12, ListOffsets v6, Metadata v9, ApiVersions v3, come later).
SUPPORTED: dict[int, tuple[int, int]] = {
    ApiKey.PRODUCE: (3, 8),
    ApiKey.FETCH: (4, 11),
    ApiKey.LIST_OFFSETS: (1, 5),
    ApiKey.METADATA: (0, 8),
    ApiKey.API_VERSIONS: (0, 2),
    ApiKey.INIT_PRODUCER_ID: (0, 1),
    # consumer groups: OffsetCommit 2-7, OffsetFetch 1-5, FindCoordinator 0-2, JoinGroup 0-5,
    # Heartbeat 0-3, LeaveGroup 0-2, SyncGroup 0-3 (ledgerstore_kafka.group_messages)
    **GROUP_SUPPORTED,
    # CreateTopics 0-4, DeleteTopics 0-3, DescribeConfigs 0-3 (ledgerstore_kafka.admin_messages)
    **ADMIN_SUPPORTED,
}

#: the transaction APIs: not listed by ApiVersions (clients learn from it that transactions are
#: not served), but a request for one is answered, with ``UNSUPPORTED_VERSION`` in every part
UNSERVED: dict[int, tuple[int, int]] = TXN_SUPPORTED


#: API key -> the name metrics label its requests with
API_NAMES: dict[int, str] = {
    ApiKey.PRODUCE: "produce", ApiKey.FETCH: "fetch", ApiKey.LIST_OFFSETS: "list_offsets",
    ApiKey.METADATA: "metadata", ApiKey.API_VERSIONS: "api_versions", ApiKey.INIT_PRODUCER_ID: "init_producer_id", 8: "offset_commit", 9: "offset_fetch",
    10: "find_coordinator", 11: "join_group", 12: "heartbeat", 13: "leave_group", 14: "sync_group",
    19: "create_topics", 20: "delete_topics", 24: "add_partitions_to_txn", 25: "add_offsets_to_txn", 26: "end_txn",
    28: "txn_offset_commit", 32: "describe_configs", 17: "sasl_handshake", 36: "sasl_authenticate",
}


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHeader:
    """Request header v1 (v2 only adds tagged fields, used by flexible versions, none served)."""

    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None

    @classmethod
    def peek(cls, frame: bytes) -> tuple[int, int, int]:
        """API key, version and correlation id: the first 8 bytes of every request, whatever its
        version (enough to answer a version not served)."""
        r = Reader(frame)
        return r.int16(), r.int16(), r.int32()

    @classmethod
    def decode(cls, r: Reader) -> RequestHeader:
        return cls(r.int16(), r.int16(), r.int32(), r.nullable_string())


def response_frame(correlation_id: int, body: bytes) -> bytes:
    """A whole response: size, header v0 (the correlation id) and body."""
    return (len(body) + 4).to_bytes(4, "big") + correlation_id.to_bytes(4, "big", signed=True) + body


# --- ApiVersions -----------------------------------------------------------------------------

def encode_api_versions(version: int, error: int = ErrorCode.NONE,
                        served: Mapping[int, tuple[int, int]] = SUPPORTED) -> bytes:
    """ApiVersions response: error, every API ``served`` with its range, throttle time (v1+).
    Asked at a version not served, the answer is v0 with ``UNSUPPORTED_VERSION`` (as Kafka
    brokers answer it), so the client retries with the highest version listed."""
    w = Writer().int16(error).array_length(len(served))
    for key, (low, high) in sorted(served.items()):
        w.int16(key).int16(low).int16(high)
    if version >= 1:
        w.int32(0)
    return w.bytes()


# --- Metadata --------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class MetadataRequest:
    topics: list[str] | None  # None: every topic
    allow_auto_topic_creation: bool


def decode_metadata(r: Reader, version: int) -> MetadataRequest:
    n = r.array_length()
    if n == -1 and version == 0:
        raise MalformedRequest("Metadata v0 has no null topic list")
    topics = None if n == -1 else [r.string() for _ in range(n)]
    if version == 0 and not topics:
        topics = None  # v0: an empty list means every topic
    auto = r.boolean() if version >= 4 else True
    if version >= 8:
        r.boolean()  # include_cluster_authorized_operations
        r.boolean()  # include_topic_authorized_operations
    return MetadataRequest(topics, auto)


@dataclasses.dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    error: int
    partitions: int


def encode_metadata(version: int, brokers: list[tuple[int, str, int]], controller_id: int, cluster_id: str,
                    topics: list[TopicMetadata], leader: Callable[[str, int], int]) -> bytes:
    """``brokers``: ``(node id, host, port)`` of every live broker; ``leader(topic, partition)``
    names the node leading a partition (its only replica: the log's bookies hold the copies)."""
    w = Writer()
    if version >= 3:
        w.int32(0)  # throttle_time_ms
    w.array_length(len(brokers))
    for node_id, host, port in brokers:
        w.int32(node_id).string(host).int32(port)
        if version >= 1:
            w.nullable_string(None)  # rack
    if version >= 2:
        w.nullable_string(cluster_id)
    if version >= 1:
        w.int32(controller_id)
    w.array_length(len(topics))
    for t in topics:
        w.int16(t.error).string(t.name)
        if version >= 1:
            w.boolean(False)  # is_internal
        w.array_length(t.partitions)
        for p in range(t.partitions):
            node_id = leader(t.name, p)
            w.int16(ErrorCode.NONE).int32(p).int32(node_id)
            if version >= 7:
                w.int32(0)  # leader_epoch
            w.array_length(1).int32(node_id)  # replicas
            w.array_length(1).int32(node_id)  # in-sync replicas
            if version >= 5:
                w.array_length(0)  # offline replicas
        if version >= 8:
            w.int32(-2147483648)  # topic_authorized_operations: not asked for
    if version >= 8:
        w.int32(-2147483648)  # cluster_authorized_operations
    return w.bytes()


# --- Produce ---------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class ProduceRequest:
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: list[tuple[str, list[tuple[int, bytes | None]]]]


def decode_produce(r: Reader, version: int) -> ProduceRequest:
    transactional_id = r.nullable_string()
    acks, timeout_ms = r.int16(), r.int32()
    topics = r.topics(lambda p: (p.int32(), p.nullable_bytes()))
    return ProduceRequest(transactional_id, acks, timeout_ms, topics)


@dataclasses.dataclass(frozen=True, slots=True)
class ProducePartitionResult:
    partition: int
    error: int
    base_offset: int = -1
    log_start_offset: int = -1
    message: str | None = None


def encode_produce(version: int, results: list[tuple[str, list[ProducePartitionResult]]]) -> bytes:
    def partition(w: Writer, p: ProducePartitionResult) -> None:
        w.int32(p.partition).int16(p.error).int64(p.base_offset).int64(-1)  # log_append_time: producer's time
        if version >= 5:
            w.int64(p.log_start_offset)
        if version >= 8:
            w.array_length(0).nullable_string(p.message)

    return Writer().topics(results, partition).int32(0).bytes()  # then throttle_time_ms


# --- Fetch -----------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class FetchPartition:
    partition: int
    fetch_offset: int
    max_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class FetchRequest:
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    session_id: int
    session_epoch: int
    topics: list[tuple[str, list[FetchPartition]]]


def decode_fetch(r: Reader, version: int) -> FetchRequest:
    r.int32()  # replica_id: -1 for consumers
    max_wait_ms, min_bytes, max_bytes = r.int32(), r.int32(), r.int32()
    r.int8()  # isolation_level: no transactions, so read-committed and read-uncommitted read alike
    session_id, session_epoch = (r.int32(), r.int32()) if version >= 7 else (0, -1)

    def partition(p: Reader) -> FetchPartition:
        index = p.int32()
        if version >= 9:
            p.int32()  # current_leader_epoch
        offset = p.int64()
        if version >= 5:
            p.int64()  # log_start_offset (followers only)
        return FetchPartition(index, offset, p.int32())

    topics = r.topics(partition)
    if version >= 7:
        r.topics(Reader.int32)  # forgotten topics: there are no sessions to forget from
    if version >= 11:
        r.string()  # rack_id
    return FetchRequest(max_wait_ms, min_bytes, max_bytes, session_id, session_epoch, topics)


@dataclasses.dataclass(frozen=True, slots=True)
class FetchPartitionResult:
    partition: int
    error: int
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


def encode_fetch(version: int, error: int, results: list[tuple[str, list[FetchPartitionResult]]]) -> bytes:
    w = Writer().int32(0)  # throttle_time_ms
    if version >= 7:
        w.int16(error).int32(0)  # session_id 0: no fetch session is created (every fetch is full)

    def partition(w: Writer, p: FetchPartitionResult) -> None:
        w.int32(p.partition).int16(p.error).int64(p.high_watermark)
        w.int64(p.high_watermark)  # last_stable_offset: no transactions, so the high watermark
        if version >= 5:
            w.int64(p.log_start_offset)
        w.array_length(-1)  # aborted transactions: none
        if version >= 11:
            w.int32(-1)  # preferred_read_replica
        w.nullable_bytes(p.records)

    return w.topics(results, partition).bytes()


# --- ListOffsets -----------------------------------------------------------------------------

#: ListOffsets' special timestamps
LATEST, EARLIEST = -1, -2


@dataclasses.dataclass(frozen=True, slots=True)
class ListOffsetsRequest:
    topics: list[tuple[str, list[tuple[int, int]]]]  # (partition, timestamp)


def decode_list_offsets(r: Reader, version: int) -> ListOffsetsRequest:
    r.int32()  # replica_id
    if version >= 2:
        r.int8()  # isolation_level

    def partition(p: Reader) -> tuple[int, int]:
        index = p.int32()
        if version >= 4:
            p.int32()  # current_leader_epoch
        return index, p.int64()

    return ListOffsetsRequest(r.topics(partition))


@dataclasses.dataclass(frozen=True, slots=True)
class ListOffsetsResult:
    partition: int
    error: int
    timestamp: int = -1
    offset: int = -1


def encode_list_offsets(version: int, results: list[tuple[str, list[ListOffsetsResult]]]) -> bytes:
    w = Writer()
    if version >= 2:
        w.int32(0)  # throttle_time_ms

    def partition(w: Writer, p: ListOffsetsResult) -> None:
        w.int32(p.partition).int16(p.error).int64(p.timestamp).int64(p.offset)
        if version >= 4:
            w.int32(0 if p.error == ErrorCode.NONE else -1)  # leader_epoch

    return w.topics(results, partition).bytes()


# --- InitProducerId --------------------------------------------------------------------------

def decode_init_producer_id(r: Reader, version: int) -> str | None:
    """The transactional id (``None`` for an idempotent producer); the transaction timeout is
    read and dropped (v0 and v1 have the same fields)."""
    transactional_id = r.nullable_string()
    r.int32()  # transaction_timeout_ms
    return transactional_id


def encode_init_producer_id(version: int, error: int, producer_id: int, epoch: int) -> bytes:
    return Writer().int32(0).int16(error).int64(producer_id).int16(epoch).bytes()  # throttle first

"""The topic administration requests and responses (CreateTopics, DeleteTopics, DescribeConfigs)
at the non-flexible versions in :data:`ADMIN_SUPPORTED`, and the transaction requests, which are
decoded only as far as their answer needs (every one is answered with an error: transactions are
not served). Decoding and encoding only; what they do is in :mod:`ledgerstore_kafka.admin`."""

from __future__ import annotations

import dataclasses

from ledgerstore_kafka.codec import Reader, Writer

__all__ = ["ADMIN_SUPPORTED", "AdminApiKey", "ConfigEntry", "CreateTopic", "TXN_SUPPORTED"]


class AdminApiKey:
    """Kafka's API keys of the topic administration and transaction APIs."""

    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_CONFIGS = 32


#: API key -> (lowest, highest) version served (the non-flexible ones)
ADMIN_SUPPORTED: dict[int, tuple[int, int]] = {
    AdminApiKey.CREATE_TOPICS: (0, 4),
    AdminApiKey.DELETE_TOPICS: (0, 3),
    AdminApiKey.DESCRIBE_CONFIGS: (0, 3),
}

#: the transaction APIs, each answered with an error (their non-flexible versions)
TXN_SUPPORTED: dict[int, tuple[int, int]] = {
    AdminApiKey.ADD_PARTITIONS_TO_TXN: (0, 2),
    AdminApiKey.ADD_OFFSETS_TO_TXN: (0, 2),
    AdminApiKey.END_TXN: (0, 2),
    AdminApiKey.TXN_OFFSET_COMMIT: (0, 2),
}

#: DescribeConfigs resource types
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4


# --- CreateTopics ----------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class CreateTopic:
    name: str
    num_partitions: int  # -1: the broker's default
    replication_factor: int  # -1: the broker's default
    assignments: int  # how many manual replica assignments the request carries
    configs: dict[str, str | None]


def decode_create_topics(r: Reader, version: int) -> tuple[list[CreateTopic], bool]:
    """The topics to create and ``validate_only`` (v1+)."""
    topics = []
    for _ in range(max(r.array_length(), 0)):
        name, partitions, replication = r.string(), r.int32(), r.int16()
        assignments = max(r.array_length(), 0)
        for _ in range(assignments):
            r.int32()
            for _ in range(max(r.array_length(), 0)):
                r.int32()
        configs = {r.string(): r.nullable_string() for _ in range(max(r.array_length(), 0))}
        topics.append(CreateTopic(name, partitions, replication, assignments, configs))
    r.int32()  # timeout_ms: creation is done before the answer
    validate_only = r.boolean() if version >= 1 else False
    return topics, validate_only


def encode_create_topics(version: int, results: list[tuple[str, int, str | None]]) -> bytes:
    """``results``: ``(name, error, message)`` per topic."""
    w = Writer()
    if version >= 2:
        w.int32(0)  # throttle_time_ms
    w.array_length(len(results))
    for name, error, message in results:
        w.string(name).int16(error)
        if version >= 1:
            w.nullable_string(message)
    return w.bytes()


# --- DeleteTopics ----------------------------------------------------------------------------

def decode_delete_topics(r: Reader, version: int) -> list[str]:
    names = [r.string() for _ in range(max(r.array_length(), 0))]
    r.int32()  # timeout_ms
    return names


def encode_delete_topics(version: int, results: list[tuple[str, int]]) -> bytes:
    w = Writer()
    if version >= 1:
        w.int32(0)  # throttle_time_ms
    w.array_length(len(results))
    for name, error in results:
        w.string(name).int16(error)
    return w.bytes()


# --- DescribeConfigs -------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    is_default: bool


def decode_describe_configs(r: Reader, version: int) -> list[tuple[int, str, list[str] | None]]:
    """``(resource type, resource name, keys asked for or None for all)`` per resource."""
    resources = []
    for _ in range(max(r.array_length(), 0)):
        kind, name = r.int8(), r.string()
        n = r.array_length()
        resources.append((kind, name, None if n == -1 else [r.string() for _ in range(n)]))
    if version >= 1:
        r.boolean()  # include_synonyms: there are none
    if version >= 3:
        r.boolean()  # include_documentation
    return resources


def encode_describe_configs(version: int,
                            results: list[tuple[int, str | None, int, str, list[ConfigEntry]]]) -> bytes:
    """``results``: ``(error, message, resource type, resource name, entries)`` per resource.
    Every entry is read-only (AlterConfigs is not served) and not sensitive."""
    w = Writer().int32(0).array_length(len(results))  # throttle_time_ms first
    for error, message, kind, name, entries in results:
        w.int16(error).nullable_string(message).int8(kind).string(name).array_length(len(entries))
        for e in entries:
            w.string(e.name).nullable_string(e.value).boolean(True)
            if version == 0:
                w.boolean(e.is_default)
            else:  # config_source: 5 DEFAULT_CONFIG, 4 STATIC_BROKER_CONFIG, 1 DYNAMIC_TOPIC_CONFIG
                w.int8(5 if e.is_default else 4 if kind == BROKER_RESOURCE else 1)
            w.boolean(False)  # is_sensitive
            if version >= 1:
                w.array_length(0)  # synonyms
            if version >= 3:
                w.int8(0).nullable_string(None)  # config_type UNKNOWN, documentation
    return w.bytes()


# --- transactions (answered with an error) ---------------------------------------------------

def encode_txn_refusal(api_key: int, r: Reader, version: int, error: int) -> bytes:
    """The answer to a transaction request, every part of it ``error``."""
    w = Writer().int32(0)  # throttle_time_ms: first in each of these responses
    if api_key in (AdminApiKey.ADD_OFFSETS_TO_TXN, AdminApiKey.END_TXN):
        return w.int16(error).bytes()
    r.string()  # transactional_id
    if api_key == AdminApiKey.TXN_OFFSET_COMMIT:
        r.string()  # group_id
    r.int64()  # producer_id
    r.int16()  # producer_epoch

    def partition(p: Reader) -> int:
        index = p.int32()
        if api_key == AdminApiKey.TXN_OFFSET_COMMIT:
            p.int64()  # committed_offset
            if version >= 2:
                p.int32()  # committed_leader_epoch
            p.nullable_string()  # committed_metadata
        return index

    topics = r.topics(partition)
    return w.topics(topics, lambda out, index: out.int32(index).int16(error)).bytes()

"""What CreateTopics, DeleteTopics and DescribeConfigs do, on topics that are sets of logs.

A topic with ``n`` partitions is the logs ``kafka-<topic>-0`` .. ``kafka-<topic>-<n-1>``
(:mod:`ledgerstore_kafka.partition`): creating it opens each log as its writer (which creates
it), deleting it closes the partitions this broker has open and deletes each log. Replication is
the logs' quorum (``ensemble``, ``write_quorum``, ``ack_quorum`` of the broker's options), so a
replication factor is accepted only as "the default" (-1) or a number the ensemble can hold. A
topic's configuration is what the mapping fixes (every batch kept until the log is truncated, no
compaction, the broker's batch limit): it is described, read-only, and a CreateTopics that asks
for anything else is refused with ``INVALID_CONFIG`` naming it.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from ledgerstore.errors import LedgerStoreError
from ledgerstore_kafka.admin_messages import BROKER_RESOURCE, TOPIC_RESOURCE, ConfigEntry, CreateTopic
from ledgerstore_kafka.partition import log_name, valid_topic

__all__ = ["AdminSettings", "TopicAdmin"]

log = logging.getLogger(__name__)

UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
KAFKA_STORAGE_ERROR = 56

#: the most partitions one CreateTopics may ask for a topic (each is a log and, once used, a writer)
MAX_PARTITIONS = 10_000

#: a topic's configuration as the mapping fixes it: name -> value
TOPIC_CONFIGS: dict[str, str] = {
    "cleanup.policy": "delete",
    "retention.ms": "-1",
    "retention.bytes": "-1",
    "compression.type": "producer",
    "message.timestamp.type": "CreateTime",
}


@dataclasses.dataclass(frozen=True, slots=True)
class AdminSettings:
    """What topic administration needs of the broker's options."""

    node_id: int
    num_partitions: int
    max_batch_bytes: int
    max_request_bytes: int
    auto_create_topics: bool
    ensemble: int  # 0: the client's default
    password: bytes


class TopicAdmin:
    """Creates, deletes and describes topics. ``topics`` lists them with their partition counts,
    ``create`` opens a topic's partitions, ``forget`` closes the ones this broker has open."""

    def __init__(self, client: Any, settings: AdminSettings, topics: Callable[[], Awaitable[dict[str, int]]],
                 create: Callable[[str, int], Awaitable[None]], forget: Callable[[str], Awaitable[None]]) -> None:
        self.client = client
        self.settings = settings
        self._topics = topics
        self._create = create
        self._forget = forget

    async def create_topics(self, topics: list[CreateTopic], validate_only: bool) -> list[tuple[str, int, str | None]]:
        """``(name, error, message)`` per topic asked for, created unless ``validate_only``."""
        known = await self._topics()
        out = []
        for t in topics:
            error, message = self._refusal(t, known)
            if error == 0 and not validate_only:
                partitions = t.num_partitions if t.num_partitions != -1 else self.settings.num_partitions
                try:
                    await self._create(t.name, partitions)
                except LedgerStoreError as exc:
                    log.warning("creating topic %r: %s", t.name, exc)
                    error, message = KAFKA_STORAGE_ERROR, f"creating the topic's logs failed: {exc}"
            out.append((t.name, error, message))
        return out

    def _refusal(self, t: CreateTopic, known: dict[str, int]) -> tuple[int, str | None]:
        ensemble = self.settings.ensemble or 3
        if not valid_topic(t.name):
            return INVALID_TOPIC_EXCEPTION, "a topic name is 1-187 characters of A-Z a-z 0-9 . _ -"
        if t.name in known:
            return TOPIC_ALREADY_EXISTS, f"topic {t.name!r} exists with {known[t.name]} partitions"
        if t.num_partitions != -1 and not 1 <= t.num_partitions <= MAX_PARTITIONS:
            return INVALID_PARTITIONS, f"num_partitions must be -1 or 1..{MAX_PARTITIONS}, not {t.num_partitions}"
        if t.replication_factor != -1 and not 1 <= t.replication_factor <= ensemble:
            return INVALID_REPLICATION_FACTOR, (f"replication is the logs' quorum (ensemble {ensemble}): "
                                                f"replication_factor must be -1 or 1..{ensemble}")
        if t.assignments:
            return INVALID_REPLICA_ASSIGNMENT, "replicas are bookies chosen per ledger: no manual assignment"
        for name, value in t.configs.items():
            if TOPIC_CONFIGS.get(name) != value:
                return INVALID_CONFIG, (f"config {name}={value} is not served: a topic's configuration is fixed "
                                        f"({', '.join(f'{k}={v}' for k, v in TOPIC_CONFIGS.items())})")
        return 0, None

    async def delete_topics(self, names: list[str]) -> list[tuple[str, int]]:
        """``(name, error)`` per topic: its partitions closed here and its logs deleted."""
        known = await self._topics()
        out = []
        for name in names:
            if name not in known:
                out.append((name, UNKNOWN_TOPIC_OR_PARTITION))
                continue
            await self._forget(name)
            error = 0
            for index in range(known[name]):
                try:
                    await self.client.delete_log(log_name(name, index), password=self.settings.password)
                except LedgerStoreError as exc:
                    log.warning("deleting topic %r: %s", name, exc)
                    error = KAFKA_STORAGE_ERROR
            out.append((name, error))
        return out

    async def describe_configs(self, resources: list[tuple[int, str, list[str] | None]]
                               ) -> list[tuple[int, str | None, int, str, list[ConfigEntry]]]:
        """``(error, message, type, name, entries)`` per resource: a topic's fixed configuration,
        or this broker's options under Kafka's names."""
        known = await self._topics() if any(kind == TOPIC_RESOURCE for kind, _, _ in resources) else {}
        s = self.settings
        out: list[tuple[int, str | None, int, str, list[ConfigEntry]]] = []
        for kind, name, keys in resources:
            if kind == TOPIC_RESOURCE:
                if name not in known:
                    out.append((UNKNOWN_TOPIC_OR_PARTITION, f"no topic {name!r}", kind, name, []))
                    continue
                values = {**TOPIC_CONFIGS, "max.message.bytes": str(s.max_batch_bytes)}
            elif kind == BROKER_RESOURCE and name in ("", str(s.node_id)):
                values = {"num.partitions": str(s.num_partitions), "message.max.bytes": str(s.max_batch_bytes),
                          "socket.request.max.bytes": str(s.max_request_bytes),
                          "auto.create.topics.enable": str(s.auto_create_topics).lower(),
                          "log.cleanup.policy": "delete"}
            else:
                out.append((INVALID_REQUEST, f"no resource of type {kind} named {name!r} on broker {s.node_id}",
                            kind, name, []))
                continue
            wanted = values if keys is None else {k: v for k, v in values.items() if k in keys}
            out.append((0, None, kind, name, [ConfigEntry(k, v, kind == TOPIC_RESOURCE) for k, v in wanted.items()]))
        return out

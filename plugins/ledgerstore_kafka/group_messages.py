"""The consumer group requests and responses (FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit, OffsetFetch) at the non-flexible versions in :data:`GROUP_SUPPORTED`.
Decoding and encoding only; what they do is in :mod:`ledgerstore_kafka.groups`."""

from __future__ import annotations

import dataclasses

from ledgerstore_kafka.codec import Reader, Writer

__all__ = ["GROUP_SUPPORTED", "GroupApiKey"]


class GroupApiKey:
    """Kafka's API keys of the group APIs."""

    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14


#: API key -> (lowest, highest) version served (all non-flexible; OffsetCommit from v2 and
#: OffsetFetch from v1, the Kafka 2.1 baseline of KIP-896)
GROUP_SUPPORTED: dict[int, tuple[int, int]] = {
    GroupApiKey.OFFSET_COMMIT: (2, 7),
    GroupApiKey.OFFSET_FETCH: (1, 5),
    GroupApiKey.FIND_COORDINATOR: (0, 2),
    GroupApiKey.JOIN_GROUP: (0, 5),
    GroupApiKey.HEARTBEAT: (0, 3),
    GroupApiKey.LEAVE_GROUP: (0, 2),
    GroupApiKey.SYNC_GROUP: (0, 3),
}


def _throttle(w: Writer, version: int, since: int) -> Writer:
    return w.int32(0) if version >= since else w


# --- FindCoordinator -------------------------------------------------------------------------

def decode_find_coordinator(r: Reader, version: int) -> tuple[str, int]:
    """``(key, key_type)``: key type 0 is a group, 1 a transaction."""
    key = r.string()
    return key, (r.int8() if version >= 1 else 0)


def encode_find_coordinator(version: int, error: int, node_id: int, host: str, port: int) -> bytes:
    w = _throttle(Writer(), version, 1).int16(error)
    if version >= 1:
        w.nullable_string(None)
    return w.int32(node_id).string(host).int32(port).bytes()


# --- JoinGroup -------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class JoinGroupRequest:
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: list[tuple[str, bytes]]


def decode_join_group(r: Reader, version: int) -> JoinGroupRequest:
    group_id, session_timeout_ms = r.string(), r.int32()
    rebalance_timeout_ms = r.int32() if version >= 1 else session_timeout_ms
    member_id = r.string()
    if version >= 5:
        r.nullable_string()  # group_instance_id: static membership is not served
    protocol_type = r.string()
    protocols = [(r.string(), r.nullable_bytes() or b"") for _ in range(max(r.array_length(), 0))]
    return JoinGroupRequest(group_id, session_timeout_ms, rebalance_timeout_ms, member_id, protocol_type, protocols)


def encode_join_group(version: int, error: int, generation: int, protocol: str, leader: str, member_id: str,
                      members: list[tuple[str, bytes]]) -> bytes:
    w = _throttle(Writer(), version, 2).int16(error).int32(generation).string(protocol).string(leader)
    w.string(member_id).array_length(len(members))
    for member, metadata in members:
        w.string(member)
        if version >= 5:
            w.nullable_string(None)
        w.nullable_bytes(metadata)
    return w.bytes()


# --- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class SyncGroupRequest:
    group_id: str
    generation: int
    member_id: str
    assignments: dict[str, bytes]


def decode_sync_group(r: Reader, version: int) -> SyncGroupRequest:
    group_id, generation, member_id = r.string(), r.int32(), r.string()
    if version >= 3:
        r.nullable_string()  # group_instance_id
    assignments = {r.string(): r.nullable_bytes() or b"" for _ in range(max(r.array_length(), 0))}
    return SyncGroupRequest(group_id, generation, member_id, assignments)


def encode_sync_group(version: int, error: int, assignment: bytes) -> bytes:
    return _throttle(Writer(), version, 1).int16(error).nullable_bytes(assignment).bytes()


def decode_heartbeat(r: Reader, version: int) -> tuple[str, int, str]:
    """``(group_id, generation, member_id)``."""
    group_id, generation, member_id = r.string(), r.int32(), r.string()
    if version >= 3:
        r.nullable_string()  # group_instance_id
    return group_id, generation, member_id


def decode_leave_group(r: Reader, version: int) -> tuple[str, str]:
    """``(group_id, member_id)``."""
    return r.string(), r.string()


def encode_error_only(version: int, error: int) -> bytes:
    """Heartbeat and LeaveGroup answers: throttle time (v1+) and an error code."""
    return _throttle(Writer(), version, 1).int16(error).bytes()


# --- OffsetCommit, OffsetFetch ---------------------------------------------------------------

@dataclasses.dataclass(frozen=True, slots=True)
class OffsetCommitRequest:
    group_id: str
    generation: int
    member_id: str
    topics: list[tuple[str, list[tuple[int, int, str | None]]]]  # (partition, offset, metadata)


def decode_offset_commit(r: Reader, version: int) -> OffsetCommitRequest:
    group_id, generation, member_id = r.string(), r.int32(), r.string()
    if version >= 7:
        r.nullable_string()  # group_instance_id
    if 2 <= version <= 4:
        r.int64()  # retention_time_ms: committed offsets are kept until the group's log is truncated

    def partition(p: Reader) -> tuple[int, int, str | None]:
        index, offset = p.int32(), p.int64()
        if version >= 6:
            p.int32()  # committed_leader_epoch
        return index, offset, p.nullable_string()

    return OffsetCommitRequest(group_id, generation, member_id, r.topics(partition))


def encode_offset_commit(version: int, results: list[tuple[str, list[tuple[int, int]]]]) -> bytes:
    w = _throttle(Writer(), version, 3)
    return w.topics(results, lambda w, p: w.int32(p[0]).int16(p[1])).bytes()


def decode_offset_fetch(r: Reader, version: int) -> tuple[str, list[tuple[str, list[int]]] | None]:
    """``(group_id, topics)``; ``None`` topics (v2+): every partition the group committed."""
    group_id = r.string()
    n = r.array_length()
    if n == -1:
        return group_id, None
    topics = []
    for _ in range(n):
        name = r.string()
        topics.append((name, [r.int32() for _ in range(max(r.array_length(), 0))]))
    return group_id, topics


def encode_offset_fetch(version: int, error: int,
                        results: list[tuple[str, list[tuple[int, int, str | None, int]]]]) -> bytes:
    """Each partition ``(index, offset, metadata, error)``; offset -1 when none was committed."""

    def partition(w: Writer, p: tuple[int, int, str | None, int]) -> None:
        w.int32(p[0]).int64(p[1])
        if version >= 5:
            w.int32(-1)  # committed_leader_epoch
        w.nullable_string(p[2]).int16(p[3])

    w = _throttle(Writer(), version, 3).topics(results, partition)
    if version >= 2:
        w.int16(error)
    return w.bytes()
